//! [`Recent`]: a small per-thread memo of values computed from short strings.
//!
//! Why: a service calls the same few URLs over and over, and turning a URL's text into a
//! parsed value (a `Url`, an `http::Uri`) is a good part of what a request costs. Parsing is
//! a pure function of the text, so a remembered answer is the same answer.

use std::{cell::RefCell, thread::LocalKey};

/// The last values a thread computed from texts, oldest first; declare one per kind of
/// value with `thread_local!` and use it through [`recall`].
pub type Recent<T> = RefCell<Vec<(Box<str>, T)>>;

/// Texts longer than this are never remembered (they are rarely repeated, and comparing
/// them costs more than it saves).
pub const RECENT_MAX_TEXT: usize = 256;

/// The value for `text`: remembered in `memo` (which keeps the last `keep`), or computed by
/// `compute` and then remembered if it succeeded. A memo that is gone (the thread is
/// ending) only means computing.
///
/// # Examples
/// ```
/// use soulbase_net_core::recent::{recall, Recent};
///
/// thread_local! {
///     static LENGTHS: Recent<usize> = const { Recent::new(Vec::new()) };
/// }
/// let mut computed = 0;
/// for _ in 0..3 {
///     let len = recall(&LENGTHS, 4, "abc", |t| {
///         computed += 1;
///         Ok::<_, ()>(t.len())
///     });
///     assert_eq!(len, Ok(3));
/// }
/// assert_eq!(computed, 1);
/// ```
///
/// # Errors
/// Whatever `compute` returns; errors are not remembered.
pub fn recall<T: Clone + 'static, E>(
    memo: &'static LocalKey<Recent<T>>,
    keep: usize,
    text: &str,
    compute: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, E> {
    if text.len() > RECENT_MAX_TEXT {
        return compute(text);
    }
    let hit = memo
        .try_with(|recent| {
            recent
                .borrow()
                .iter()
                .find(|(seen, _)| &**seen == text)
                .map(|(_, value)| value.clone())
        })
        .ok()
        .flatten();
    if let Some(value) = hit {
        return Ok(value);
    }
    let value = compute(text)?;
    let _ = memo.try_with(|recent| {
        let mut recent = recent.borrow_mut();
        if recent.len() >= keep.max(1) {
            recent.remove(0);
        }
        recent.push((text.into(), value.clone()));
    });
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static MEMO: Recent<String> = const { Recent::new(Vec::new()) };
    }

    #[test]
    fn keeps_the_last_few_and_never_errors_or_long_texts() {
        let calls = std::cell::Cell::new(0);
        let upper = |t: &str| {
            calls.set(calls.get() + 1);
            if t == "bad" {
                Err("bad")
            } else {
                Ok(t.to_uppercase())
            }
        };
        for t in ["a", "b", "a", "b"] {
            assert_eq!(recall(&MEMO, 2, t, upper), Ok(t.to_uppercase()));
        }
        assert_eq!(calls.get(), 2);
        // A third text pushes out the oldest ("a"), which is then computed again.
        recall(&MEMO, 2, "c", upper).unwrap();
        recall(&MEMO, 2, "a", upper).unwrap();
        assert_eq!(calls.get(), 4);
        // Errors are computed each time; so are texts past the length cap.
        for _ in 0..2 {
            assert_eq!(recall(&MEMO, 2, "bad", upper), Err("bad"));
        }
        let long = "x".repeat(RECENT_MAX_TEXT + 1);
        for _ in 0..2 {
            recall(&MEMO, 2, &long, upper).unwrap();
        }
        assert_eq!(calls.get(), 8);
    }
}
