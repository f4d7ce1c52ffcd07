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

    #[test]
    fn a_blocks_depth_is_how_many_held_blocks_were_touched_after_it(
        capacity in 1usize..40,
        touches in prop::collection::vec(prop::collection::vec(0u64..60, 1..8), 0..200)) {
        let now = Instant::now();
        let mut held = Held::new(capacity, HOUR);
        // The most recent first.
        let mut order: Vec<u64> = Vec::new();
        for (k, hashes) in touches.iter().enumerate() {
            held.insert(hashes.iter().copied(), now);
            for h in hashes.iter().rev() {
                order.retain(|o| o != h);
                order.insert(0, *h);
            }
            order.truncate(capacity);
            if k % 37 == 36 {
                held.resize(capacity);
            }
            for h in 0..60 {
                let want = order.iter().position(|o| *o == h).map(|p| p as u32);
                prop_assert_eq!(held.depth(h), want, "block {} after insert {}", h, k);
            }
        }
    }

    #[test]
    fn a_prefix_the_presence_bits_rule_out_is_one_the_set_does_not_hold(
        capacity in 1usize..60,
        // (which of three prompts, how many blocks of it, learned from a peer)
        inserts in prop::collection::vec((0usize..3, 1usize..14, proptest::bool::ANY), 0..40),
        shrink_to in 1usize..60,
        asked in (0usize..3, 1usize..14, 0usize..14),
        hint in prop::option::of(0u64..4)) {
        let now = Instant::now();
        let prompts: Vec<Vec<u64>> = (0..3u8)
            .map(|k| chain(&[[k; 8], [9; 8]].concat().repeat(7), 8))
            .collect();
        let mut held = Held::new(capacity, HOUR);
        let presence = held.presence();
        for (k, &(p, len, peer)) in inserts.iter().enumerate() {
            let blocks = &prompts[p][..len];
            if peer {
                held.insert(coarse(blocks), now);
            } else {
                held.insert(blocks.iter().copied(), now);
            }
            if k == inserts.len() / 2 {
                held.resize(shrink_to);
            }
        }
        let (p, len, differ_at) = asked;
        let mut asked = prompts[p][..len].to_vec();
        for h in asked.iter_mut().skip(differ_at) {
            *h ^= 1;
        }
        if !Held::may_hold_any(&presence, &asked, hint) {
            prop_assert_eq!(held.longest(&asked, now), 0);
            prop_assert!(hint.is_none_or(|h| held.longest(&[h], now) == 0));
        }
        for h in prompts.iter().flatten() {
            if held.longest(&[*h], now) == 1 {
                prop_assert!(presence.may_hold(*h), "every block held is maybe held");
            }
        }
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

/// Sixteen system prompts of 31 blocks, each opening conversations of four turns that add
/// three blocks a turn, `active` conversations at a time taking turns in a pseudo-random order:
/// the shape of `benches/conversations.sh`, in blocks.
fn conversation_prompts(active: u64, requests: usize) -> impl Iterator<Item = Vec<u64>> {
    let mut talking: Vec<(u64, u64)> = (0..active).map(|c| (c, 1)).collect();
    let mut next = active;
    let mut draw = 0x2545_f491_4f6c_dd1d_u64;
    std::iter::repeat_with(move || {
        draw ^= draw << 13;
        draw ^= draw >> 7;
        draw ^= draw << 17;
        let slot = (draw % active) as usize;
        let (c, turn) = talking[slot];
        let group = c.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60;
        let prompt = (0..31)
            .map(|k| (group << 32) | k)
            .chain((0..3 * turn).map(|k| ((c + 100) << 32) | k))
            .collect();
        talking[slot] = if turn == 4 {
            next += 1;
            (next - 1, 1)
        } else {
            (c, turn + 1)
        };
        prompt
    })
    .take(requests)
}

/// Routes `prompts` to an LRU engine of `engine_blocks` through an index configured for
/// `configured` blocks and holding `start` at first, calibrating it from what the engine
/// reports; the index's capacity at the end and the share of the last 500 requests whose
/// expected hit the engine fell short of.
fn calibrate_against(
    engine_blocks: usize,
    (configured, start): (usize, usize),
    prompts: impl Iterator<Item = Vec<u64>>,
) -> (usize, f64) {
    let now = Instant::now();
    let mut engine = Held::new(engine_blocks, HOUR);
    let mut index = Held::new(start, HOUR);
    let mut calibration = Calibration::new(configured);
    let mut short = std::collections::VecDeque::new();
    for prompt in prompts {
        let expected = index.longest(&prompt, now);
        let depth = expected.checked_sub(1).and_then(|k| index.depth(prompt[k]));
        let reported = engine.longest(&prompt, now);
        index.insert(prompt.iter().copied(), now);
        engine.insert(prompt.iter().copied(), now);
        let tokens = |blocks: usize| blocks as u64 * 64;
        let report = Report {
            expected: tokens(expected),
            depth,
            estimated_prompt: tokens(prompt.len()),
            reported: tokens(reported),
            prompt: tokens(prompt.len()),
            block_tokens: 64,
        };
        if let Some(blocks) = calibration.observe(&report, index.capacity()) {
            index.resize(blocks);
        }
        short.push_back(reported < expected);
        if short.len() > 500 {
            short.pop_front();
        }
    }
    let misled = short.iter().filter(|&&s| s).count() as f64 / short.len() as f64;
    (index.capacity(), misled)
}

#[test]
fn calibration_finds_an_lru_engines_capacity_from_the_hits_it_reports() {
    // The engine holds 200 blocks, about a third of the working set; the index starts at a
    // thousand times that.
    let (capacity, misled) =
        calibrate_against(200, (200_000, 200_000), conversation_prompts(24, 3000));
    assert!(
        (170..=240).contains(&capacity),
        "calibrated to {capacity} blocks"
    );
    assert!(
        misled < 0.05,
        "{misled} of requests expected a hit the engine had lost"
    );
}

#[test]
fn an_index_too_small_grows_back_from_hits_it_did_not_expect_but_never_past_its_configured_size() {
    let (capacity, _) = calibrate_against(200, (100_000, 50), conversation_prompts(24, 3000));
    assert!(
        (170..=260).contains(&capacity),
        "grown back to {capacity} blocks"
    );
    let mut c = Calibration::new(400);
    let mut capacity = 40;
    let unexpected = Report {
        expected: 0,
        depth: None,
        estimated_prompt: 2000,
        reported: 1500,
        prompt: 2000,
        block_tokens: 64,
    };
    for _ in 0..20 * CALIBRATION_WINDOW {
        if let Some(n) = c.observe(&unexpected, capacity) {
            capacity = n;
        }
    }
    assert_eq!(capacity, 400);
    let silent = Report {
        reported: 0,
        ..unexpected
    };
    for _ in 0..CALIBRATION_WINDOW {
        assert_eq!(
            c.observe(&silent, 60),
            None,
            "no hit either way says nothing"
        );
    }
}

#[test]
fn a_stray_miss_among_hits_moves_nothing_and_a_cache_that_keeps_nothing_empties_the_index() {
    let report = |depth: u32, reported: u64| Report {
        expected: 2000,
        depth: Some(depth),
        estimated_prompt: 2100,
        reported,
        prompt: 2100,
        block_tokens: 64,
    };
    let mut c = Calibration::new(1000);
    for k in 0..4 * CALIBRATION_WINDOW {
        // One in sixteen lost, shallow: the engine's order is not quite the index's.
        let lost = k % CALIBRATION_WINDOW == 3;
        let got = c.observe(&report(10 + 13 * k, if lost { 0 } else { 1990 }), 1000);
        assert_eq!(got, None, "report {k}");
    }
    let mut c = Calibration::new(1000);
    let mut capacity: usize = 1000;
    for k in 0..40 * CALIBRATION_WINDOW {
        let depth = u32::try_from(k as usize % capacity).unwrap_or(0);
        if let Some(n) = c.observe(&report(depth, 0), capacity) {
            capacity = n;
        }
    }
    assert_eq!(capacity, MIN_CALIBRATED_BLOCKS);
}

#[test]
fn an_engine_that_kept_the_system_prompt_but_lost_the_history_after_it_is_a_loss() {
    // A turn's prompt: 2,000 tokens of a shared system prompt and a history of 240 after it.
    let turn = |depth: u32, reported: u64| Report {
        expected: 2240,
        depth: Some(depth),
        estimated_prompt: 2280,
        reported,
        prompt: 2264,
        block_tokens: 64,
    };
    let mut c = Calibration::new(1000);
    let mut got = None;
    for k in 0..CALIBRATION_WINDOW {
        // Held whole at depth 100; at depth 150 only the system prompt was left.
        let report = if k % 2 == 0 {
            turn(100, 2256)
        } else {
            turn(150, 2000)
        };
        got = c.observe(&report, 1000);
    }
    assert_eq!(
        got,
        Some(125),
        "between the deepest held and the shallowest lost"
    );
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
