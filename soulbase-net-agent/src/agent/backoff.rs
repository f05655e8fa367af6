//! [`Backoff`]: the waits of the claim loop and the reporter after an empty batch or a failed
//! call — doubling from a minimum to a maximum, each drawn in 50–100 % of its step so that a
//! fleet started together does not call in step.

use std::time::Duration;

/// A doubling wait with jitter.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    /// From `min` up to `max` (`max` is raised to `min` if below it).
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            step: min,
        }
    }

    /// The next wait: the current step, jittered, and the step doubles.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        step.mul_f64(0.5 + fastrand::f64() / 2.0)
    }

    /// Back to the minimum (a batch came).
    pub(crate) fn reset(&mut self) {
        self.step = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let steps = [100, 200, 400, 800, 800];
        for step in steps {
            let d = b.next_delay();
            let step = Duration::from_millis(step);
            assert!(d >= step / 2 && d <= step, "{d:?} for a step of {step:?}");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
