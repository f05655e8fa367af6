//! The injected random source behind jitter, so tests can fix the draws.

/// A source of numbers uniform in `[0, 1)`.
///
/// Any `FnMut() -> f64` is one (tests pass a closure returning fixed draws); production uses
/// [`FastRand`]. Values outside `[0, 1)`, and NaN, are clamped by the users of the source, so
/// a bad source can skew results but never panic.
pub(crate) trait Random {
    /// The next draw, expected in `[0, 1)`.
    fn unit(&mut self) -> f64;
}

/// [`fastrand`]'s thread-local generator.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FastRand;

impl Random for FastRand {
    fn unit(&mut self) -> f64 {
        fastrand::f64()
    }
}

impl<F: FnMut() -> f64> Random for F {
    fn unit(&mut self) -> f64 {
        self()
    }
}

/// A draw clamped into `[0, 1]` (NaN → 0).
pub(crate) fn unit(rng: &mut dyn Random) -> f64 {
    let r = rng.unit();
    if r.is_nan() {
        0.0
    } else {
        r.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_sources_are_clamped() {
        for bad in [f64::NAN, -1.0, 1.0, 7.5, f64::INFINITY] {
            let mut src = move || bad;
            assert!((0.0..=1.0).contains(&unit(&mut src)));
        }
    }
}
