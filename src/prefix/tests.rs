use proptest::prelude::*;

use super::*;

fn chain(text: &[u8], block: usize) -> Vec<u64> {
    let mut c = Chain::new(b"m", block);
    c.feed(text);
    c.finish()
}

const HOUR: Duration = Duration::from_secs(3600);

#[test]
fn a_prompt_that_extends_another_shares_its_whole_blocks_and_nothing_after_they_differ() {
    let first = chain(b"system prompt.. question one", 4);
    let next = chain(b"system prompt.. question one, answer, question two", 4);
    assert_eq!(first.len(), 7, "28 bytes: 7 whole blocks");
    assert_eq!(next[..7], first[..]);
    let other = chain(b"system prompt.. other question", 4);
    assert_eq!(other[..4], first[..4]);
    assert_ne!(other[4], first[4]);
    assert_ne!(
        other[5..],
        first[5..7],
        "after a difference every later hash differs"
    );
}

#[test]
fn the_same_text_under_another_model_shares_nothing() {
    let mut a = Chain::new(b"llama", 4);
    let mut b = Chain::new(b"qwen", 4);
    a.feed(b"identical text");
    b.feed(b"identical text");
    let (a, b) = (a.finish(), b.finish());
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
}

proptest! {
    #[test]
    fn feeding_in_pieces_hashes_as_feeding_at_once(text in prop::collection::vec(any::<u8>(), 0..300),
                                                   cuts in prop::collection::vec(0usize..300, 0..8),
                                                   block in 1usize..40) {
        let whole = chain(&text, block);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
        cuts.sort_unstable();
        let mut c = Chain::new(b"m", block);
        let mut at = 0;
        for cut in cuts.into_iter().chain([text.len()]) {
            c.feed(&text[at..cut]);
            at = cut;
        }
        prop_assert_eq!(c.finish(), whole);
    }

    #[test]
    fn the_held_length_is_the_longest_common_prefix_with_what_was_inserted(
        held_len in 0usize..60, asked_len in 0usize..60, differ_at in 0usize..80) {
        let now = Instant::now();
        let base = chain(&[7u8; 64 * 4], 4);
        let mut asked = base[..asked_len].to_vec();
        if differ_at < asked.len() {
            for h in &mut asked[differ_at..] {
                *h ^= 1;
            }
        }
        let mut held = Held::new(1000, HOUR);
        held.insert(base[..held_len].iter().copied(), now);
        let want = held_len.min(asked_len).min(differ_at);
        prop_assert_eq!(held.longest(&asked, now), want);
    }
}

#[tokio::test(start_paused = true)]
async fn eviction_takes_the_tail_of_a_prefix_first() {
    let now = Instant::now();
    let a = chain(&[1u8; 40], 4);
    let b = chain(&[2u8; 40], 4);
    let mut held = Held::new(14, HOUR);
    held.insert(a.iter().copied(), now);
    held.insert(b.iter().copied(), now);
    // 20 blocks into 14: the six least recent go, which are a's last six.
    assert_eq!(held.longest(&a, now), 4);
    assert_eq!(held.longest(&b, now), 10);
    assert_eq!(held.evicted(), 6);
    held.resize(12);
    assert_eq!(held.longest(&a, now), 2);
    assert_eq!(held.evicted(), 8);
}

#[tokio::test(start_paused = true)]
async fn a_block_not_touched_within_its_time_to_live_is_not_held() {
    let start = Instant::now();
    let a = chain(&[1u8; 40], 4);
    let mut held = Held::new(100, Duration::from_secs(60));
    held.insert(a.iter().copied(), start);
    held.insert(a[..3].iter().copied(), start + Duration::from_secs(50));
    let later = start + Duration::from_secs(70);
    assert_eq!(
        held.longest(&a, later),
        3,
        "the prefix touched again is still held"
    );
    assert_eq!(held.longest(&a, start + Duration::from_secs(200)), 0);
}

#[test]
fn a_prefix_learned_at_the_coarse_positions_is_found_to_within_a_step() {
    let now = Instant::now();
    let a = chain(&[3u8; 4 * 23], 4);
    assert_eq!(a.len(), 23);
    let told: Vec<u64> = coarse(&a[..18]).collect();
    assert_eq!(told.len(), 5, "blocks 4, 8, 12, 16 and the last, 18");
    let mut held = Held::new(100, HOUR);
    held.insert(told.into_iter(), now);
    assert_eq!(held.longest(&a, now), 16);
    assert_eq!(
        held.longest(&a[..18], now),
        18,
        "the whole of what was told"
    );
}

#[test]
fn a_backend_that_reports_fewer_hits_than_expected_shrinks_its_index() {
    let mut c = Calibration::new(1000);
    let mut capacity = 1000;
    for _ in 0..CALIBRATION_WINDOW - 1 {
        assert_eq!(c.observe(2000, 600, capacity, 1000), None, "a window first");
    }
    capacity = c.observe(2000, 600, capacity, 1000).unwrap();
    assert_eq!(capacity, 500, "a share of 30% halves it at most");
    for _ in 0..CALIBRATION_WINDOW {
        if let Some(n) = c.observe(1000, 700, capacity, 500) {
            capacity = n;
        }
    }
    assert_eq!(capacity, 350);
    // Reports that match what the index expects leave it alone.
    for _ in 0..3 * CALIBRATION_WINDOW {
        assert_eq!(c.observe(1000, 1000, capacity, 350), None);
    }
}

#[test]
fn a_young_index_far_from_full_shrinks_below_what_it_holds() {
    // Configured for a million blocks, holding 600: a share of 60% must evict, not merely
    // lower a capacity nothing reaches.
    let mut c = Calibration::new(1 << 20);
    let mut got = None;
    for _ in 0..CALIBRATION_WINDOW {
        got = c.observe(1000, 600, 1 << 20, 600).or(got);
    }
    assert_eq!(got, Some(360));
}

#[test]
fn hits_the_index_forgot_grow_it_back_but_never_past_its_configured_size() {
    let mut c = Calibration::new(100);
    let mut capacity = 40;
    for _ in 0..10 * CALIBRATION_WINDOW {
        if let Some(n) = c.observe(0, 500, capacity, capacity) {
            capacity = n;
        }
    }
    assert_eq!(capacity, 100);
    // Requests that neither expected nor got a hit say nothing.
    for _ in 0..CALIBRATION_WINDOW {
        assert_eq!(c.observe(0, 0, 60, 60), None);
    }
}

#[test]
fn rendezvous_spreads_prefixes_evenly_and_a_backend_leaving_moves_only_its_own() {
    let seeds: Vec<u64> = ["pod-1", "pod-2", "pod-3", "pod-4"]
        .iter()
        .map(|n| name_seed(n))
        .collect();
    let first = |key: u64, seeds: &[u64]| {
        seeds
            .iter()
            .copied()
            .max_by_key(|&s| rendezvous(key, s))
            .unwrap()
    };
    let keys: Vec<u64> = (0..40_000u64)
        .map(|k| chain(&k.to_le_bytes(), 8)[0])
        .collect();
    let mut per_backend = [0u32; 4];
    for &key in &keys {
        let at = seeds.iter().position(|&s| s == first(key, &seeds)).unwrap();
        per_backend[at] += 1;
    }
    // 10,000 each in expectation; a binomial's sd is about 87.
    assert!(
        per_backend.iter().all(|&n| (9_500..10_500).contains(&n)),
        "{per_backend:?}"
    );
    // pod-4 leaves: a key that was not on it keeps its backend.
    for &key in &keys {
        let before = first(key, &seeds);
        if before != seeds[3] {
            assert_eq!(first(key, &seeds[..3]), before);
        }
    }
}
