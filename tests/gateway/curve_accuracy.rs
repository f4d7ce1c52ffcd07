//! Accuracy of the measured curve against the simulator's truth and the client's own numbers.
//! Timing-sensitive: these run in their own test binary, one at a time (see `accuracy_tests.rs`).

use tpsgate::sim::config::{EngineRaw, StreamRaw, UsageStyle};

use crate::support::curves::{OUTPUT, PROMPT, curve, level, point};
use crate::support::{self, rel_err};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_curve_matches_the_truth_and_the_client_at_1_4_16_32() {
    let _alone = crate::ALONE.lock().await;
    let (_fleet, sim) = support::start(support::spec(
        "big",
        EngineRaw::default(),
        StreamRaw::default(),
        vec![],
    ))
    .await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    for c in [1usize, 4, 16, 32] {
        // Twice the concurrency in measured requests, so that the warm-up burst (all c admitted at
        // once, prefills stacked) is a minority of the bucket the gateway reports.
        let report = level(gw.addr(), c, (2 * c).max(32)).await;
        assert_eq!(report.errors, 0, "{:?}", report.first_error);
        let measured = point(&curve(gw.admin_addr()).await, c as u64);
        let truth = support::truth(sim, PROMPT, OUTPUT, c).await;
        let tps = measured["per_user_tps_p50"].as_f64().unwrap();
        let want_tps = truth["per_user_tps"].as_f64().unwrap();
        assert!(
            rel_err(tps, want_tps) <= 0.05,
            "c={c}: gateway TPS {tps:.2}, truth {want_tps:.2}"
        );
        let ttft = measured["ttft_p50_s"].as_f64().unwrap();
        let want_ttft = truth["ttft_s"].as_f64().unwrap();
        assert!(
            rel_err(ttft, want_ttft) <= 0.10 || (ttft - want_ttft).abs() < 0.003,
            "c={c}: gateway TTFT {ttft:.4}, truth {want_ttft:.4}"
        );
        let client_tps = report.per_user_tps_p50.unwrap();
        eprintln!(
            "c={c}: gateway {tps:.2} tok/s {:.1} ms; truth {want_tps:.2} tok/s {:.1} ms; bench {client_tps:.2} tok/s",
            ttft * 1e3,
            want_ttft * 1e3
        );
        assert!(
            rel_err(tps, client_tps) <= 0.03,
            "c={c}: gateway {tps:.2} vs bench {client_tps:.2}"
        );
    }
    let c = curve(gw.admin_addr()).await;
    assert_eq!(c["in_flight"], 0);
    assert_eq!(c["estimated_share"], 0.0);
    let fit = &c["fit"];
    // The sim's step is 13.5 ms + 0.83 ms per request (prefill stalls add a little).
    assert!(
        rel_err(fit["tpot_per_seq_s"].as_f64().unwrap(), 0.00083) < 0.25,
        "{fit}"
    );
    assert!(
        rel_err(fit["tpot_base_s"].as_f64().unwrap(), 0.0135) < 0.10,
        "{fit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_tokens_per_chunk_are_timed_right() {
    let _alone = crate::ALONE.lock().await;
    let stream = StreamRaw {
        tokens_per_chunk: 4,
        ..StreamRaw::default()
    };
    let (_fleet, sim) = support::start(support::spec(
        "chunky",
        EngineRaw::default(),
        stream,
        vec![],
    ))
    .await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let report = level(gw.addr(), 4, 16).await;
    assert_eq!(report.errors, 0);
    let measured = point(&curve(gw.admin_addr()).await, 4);
    let truth = support::truth(sim, PROMPT, OUTPUT, 4).await;
    let tps = measured["per_user_tps_p50"].as_f64().unwrap();
    let want = truth["per_user_tps"].as_f64().unwrap();
    assert!(
        rel_err(tps, want) <= 0.05,
        "gateway TPS {tps:.2}, truth {want:.2}"
    );
}

/// The shape of `transformers serve` with a byte-level BPE tokenizer: usage on the finish chunk,
/// no `[DONE]`, and the text of the last tokens held back (not valid UTF-8 yet), so the stream
/// goes silent before it finishes. Speed counts the silent tokens' decode time, in the gateway
/// and in bench alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_held_back_by_the_engine_does_not_inflate_speed() {
    let _alone = crate::ALONE.lock().await;
    let stream = StreamRaw {
        usage: UsageStyle::FinishChunk,
        send_done: false,
        hold_back_tokens: 20,
        ..StreamRaw::default()
    };
    let (_fleet, sim) =
        support::start(support::spec("held", EngineRaw::default(), stream, vec![])).await;
    let gw = support::gateway_for(sim, "openai", "    models: {m: m}\n").await;
    let report = level(gw.addr(), 4, 16).await;
    assert_eq!(report.errors, 0, "{:?}", report.first_error);
    let truth = support::truth(sim, PROMPT, OUTPUT, 4).await;
    let want = truth["per_user_tps"].as_f64().unwrap();
    let measured = point(&curve(gw.admin_addr()).await, 4);
    let tps = measured["per_user_tps_p50"].as_f64().unwrap();
    // Timed to the last visible text, 12 of 32 tokens' window would read as 32 tokens: ~2.5x.
    assert!(
        rel_err(tps, want) <= 0.05,
        "gateway TPS {tps:.2}, truth {want:.2}"
    );
    let client = report.per_user_tps_p50.unwrap();
    assert!(
        rel_err(client, want) <= 0.05,
        "bench TPS {client:.2}, truth {want:.2}"
    );
}
