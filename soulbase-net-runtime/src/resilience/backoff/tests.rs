use super::*;
use proptest::prelude::*;

fn cfg(base_ms: u64, factor: f64, cap_ms: u64, jitter: f64, mode: JitterMode) -> BackoffCfg {
    let mut b = BackoffCfg::default();
    b.base = Duration::from_millis(base_ms);
    b.factor = factor;
    b.cap = Duration::from_millis(cap_ms);
    b.jitter = jitter;
    b.mode = mode;
    b
}

#[test]
fn default_is_full_jitter_under_the_exponential_ceiling() {
    let b = BackoffCfg::default();
    assert_eq!(backoff_delay(&b, 1, &mut || 0.0), Duration::ZERO);
    assert_eq!(
        backoff_delay(&b, 3, &mut || 0.5),
        Duration::from_millis(200)
    );
    assert_eq!(
        backoff_delay(&b, 3, &mut || 1.0),
        Duration::from_millis(400)
    );
    assert_eq!(backoff_delay(&b, 30, &mut || 1.0), Duration::from_secs(5));
}

#[test]
fn equal_jitter_keeps_half() {
    let b = cfg(100, 2.0, 5_000, 1.0, JitterMode::Equal);
    assert_eq!(
        backoff_delay(&b, 2, &mut || 0.0),
        Duration::from_millis(100)
    );
    assert_eq!(
        backoff_delay(&b, 2, &mut || 1.0),
        Duration::from_millis(200)
    );
}

#[test]
fn no_jitter_is_the_ceiling() {
    let b = cfg(100, 3.0, 5_000, 1.0, JitterMode::None);
    assert_eq!(
        backoff_delay(&b, 3, &mut || 0.0),
        Duration::from_millis(900)
    );
}

#[test]
fn odd_inputs_never_panic() {
    for j in [f64::NAN, -1.0, 2.0] {
        for r in [f64::NAN, -5.0, 5.0] {
            let b = cfg(100, 2.0, 1_000, j, JitterMode::Full);
            assert!(backoff_delay(&b, 4, &mut || r) <= b.cap);
        }
    }
    let mut huge = BackoffCfg::default();
    huge.base = Duration::MAX;
    huge.cap = Duration::MAX;
    assert!(backoff_delay(&huge, 2, &mut || 0.99) <= Duration::MAX);
    assert_eq!(scale(Duration::MAX, 1.0), Duration::MAX);
}

fn mode() -> impl Strategy<Value = JitterMode> {
    prop_oneof![
        Just(JitterMode::Full),
        Just(JitterMode::Equal),
        Just(JitterMode::None)
    ]
}

proptest! {
    #[test]
    fn within_zero_and_cap_and_ceiling_monotone(
        base in 0u64..10_000, factor in 1.0f64..8.0, extra in 0u64..60_000,
        jitter in 0.0f64..=1.0, mode in mode(), k in 1u32..64, r in 0.0f64..1.0,
    ) {
        let b = cfg(base, factor, base + extra, jitter, mode);
        let d = backoff_delay(&b, k, &mut || r);
        prop_assert!(d <= b.cap);
        prop_assert!(d <= b.max_delay(k));
        prop_assert!(b.max_delay(k) <= b.max_delay(k + 1));
    }

    #[test]
    fn full_jitter_range(base in 1u64..10_000, k in 1u32..20, r in 0.0f64..1.0) {
        let b = cfg(base, 2.0, 60_000, 1.0, JitterMode::Full);
        let d = backoff_delay(&b, k, &mut || r);
        prop_assert!(d <= b.max_delay(k));
    }

    #[test]
    fn equal_jitter_range(base in 1u64..10_000, k in 1u32..20, r in 0.0f64..1.0) {
        let b = cfg(base, 2.0, 60_000, 1.0, JitterMode::Equal);
        let ceiling = b.max_delay(k);
        let d = backoff_delay(&b, k, &mut || r);
        // Within a nanosecond of half the ceiling, for float rounding.
        prop_assert!(d + Duration::from_nanos(1) >= ceiling / 2);
        prop_assert!(d <= ceiling);
    }

    #[test]
    fn full_jitter_draws_spread_over_the_range(k in 1u32..10, seed in 0u64..1_000) {
        // With a real generator, draws cover both halves of [0, d].
        let b = cfg(100, 2.0, 5_000, 1.0, JitterMode::Full);
        let ceiling = b.max_delay(k);
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut src = move || rng.f64();
        let draws: Vec<_> = (0..200).map(|_| backoff_delay(&b, k, &mut src)).collect();
        prop_assert!(draws.iter().any(|d| *d < ceiling / 2));
        prop_assert!(draws.iter().any(|d| *d > ceiling / 2));
    }
}
