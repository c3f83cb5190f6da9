//! Full jitter, measured: with fixed seeds, every delay lies in
//! `[0, min(cap, base * 2^k)]`, the delays spread over the whole interval, and
//! their mean is half the ceiling.

use std::time::Duration;

use idem_retry::Backoff;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Sequences drawn per test: one per seed, 0..SAMPLES.
const SAMPLES: u64 = 10_000;

#[test]
fn delays_are_uniform_between_zero_and_the_ceiling() {
    // 10 attempts = 9 retries: ceilings 0.2, 0.4, ... 12.8 s, then capped at 20 s.
    let backoff = Backoff::default().with_max_attempts(10);
    let retries = 9;
    let mut sums = vec![0f64; retries];
    let mut lows = vec![f64::MAX; retries];
    let mut highs = vec![0f64; retries];

    for seed in 0..SAMPLES {
        let delays: Vec<Duration> = backoff.delays_from(StdRng::seed_from_u64(seed)).collect();
        assert_eq!(delays.len(), retries);
        for (k, delay) in delays.iter().enumerate() {
            let ceiling = backoff.ceiling(k as u32);
            assert!(*delay <= ceiling, "retry {k}: {delay:?} > {ceiling:?}");
            let share = delay.as_secs_f64() / ceiling.as_secs_f64();
            sums[k] += share;
            lows[k] = lows[k].min(share);
            highs[k] = highs[k].max(share);
        }
    }

    println!("retry  ceiling   mean/ceiling  min/ceiling  max/ceiling");
    for k in 0..retries {
        let mean = sums[k] / SAMPLES as f64;
        let ceiling = backoff.ceiling(k as u32);
        println!(
            "{k:>5}  {ceiling:>8.1?}  {mean:>12.4}  {:>11.4}  {:>11.4}",
            lows[k], highs[k]
        );
        // Uniform(0, 1) has mean 0.5 and standard deviation 1/√12 ≈ 0.289, so
        // the mean of 10,000 draws has a standard error of 0.0029. A tolerance
        // of 0.02 is about 7 standard errors: a correct implementation misses
        // it with probability below 1e-11, while "equal jitter" (mean 0.75) or
        // a delay stuck at the ceiling (mean 1.0) fails it by far. The seeds are
        // fixed, so the run is deterministic anyway.
        assert!((mean - 0.5).abs() < 0.02, "retry {k}: mean share {mean}");
        // Full jitter uses the whole interval, both ends included.
        assert!(lows[k] < 0.01, "retry {k}: lowest share {}", lows[k]);
        assert!(highs[k] > 0.99, "retry {k}: highest share {}", highs[k]);
    }
    assert_eq!(backoff.ceiling(7), Duration::from_secs(20), "the cap holds");
}

#[test]
fn the_default_sequence_is_five_delays_under_the_documented_ceilings() {
    let backoff = Backoff::default().with_seed(1);
    let ceilings_ms = [200, 400, 800, 1_600, 3_200];
    let delays: Vec<Duration> = backoff.delays().collect();
    assert_eq!(delays.len(), ceilings_ms.len());
    for (delay, ceiling) in delays.iter().zip(ceilings_ms) {
        assert!(*delay <= Duration::from_millis(ceiling));
    }
}
