//! [`Recent`]: a small per-thread memo of values computed from short strings.
//!
//! Why: a service calls the same few URLs over and over, and turning a URL's text into a
//! parsed value (a `Url`, an `http::Uri`) is a good part of what a request costs. Parsing is
//! a pure function of the text, so a remembered answer is the same answer.

use std::{cell::RefCell, thread::LocalKey};

/// The last values a thread computed from texts; declare one per kind of value with
/// `thread_local!` (`const { Recent::new() }`) and use it through [`recall`].
///
/// Each text is kept with a fingerprint of a few of its bytes, so a lookup compares whole
/// texts only where the fingerprints agree: URLs of one length that differ in a few bytes
/// (`h1.example`, `h2.example`) cost a word compare each, not a byte-by-byte one.
pub struct Recent<T> {
    memo: RefCell<Memo<T>>,
}

struct Memo<T> {
    entries: Vec<Entry<T>>,
    /// The entry the next remembered text replaces once the memo is full (the oldest).
    next: usize,
    misses: MissStreak,
}

struct Entry<T> {
    print: u64,
    text: Box<str>,
    value: T,
}

impl<T> Recent<T> {
    /// An empty memo.
    pub const fn new() -> Self {
        Self {
            memo: RefCell::new(Memo {
                entries: Vec::new(),
                next: 0,
                misses: MissStreak::new(),
            }),
        }
    }
}

impl<T> std::fmt::Debug for Recent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.memo.try_borrow().map(|m| m.entries.len()).ok();
        f.debug_struct("Recent").field("held", &held).finish()
    }
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Texts longer than this are never remembered (they are rarely repeated, and comparing
/// them costs more than it saves).
pub const RECENT_MAX_TEXT: usize = 256;

/// The misses in a row of a memo that keeps the last `keep` of what it was asked for, and
/// whether to remember the next one: every miss within the first `4 × keep` in a row, then
/// one in eight.
///
/// Why: a thread calling thousands of hosts in turn misses every time, and a memo that
/// remembers each miss copies every key in and drops another for it, for nothing; one in
/// eight still lets a new working set settle in within a few calls. [`recall`] follows it,
/// and so does the metrics observer's memo of counters.
///
/// # Examples
/// ```
/// use soulbase_net_core::recent::MissStreak;
///
/// let mut streak = MissStreak::new();
/// // A memo of 2: the first 8 misses in a row are remembered, then one in eight.
/// let kept: Vec<bool> = (0..24).map(|_| streak.miss(2)).collect();
/// assert!(kept[..8].iter().all(|&k| k));
/// assert_eq!(kept[8..].iter().filter(|&&k| k).count(), 2);
/// streak.hit();
/// assert!(streak.miss(2), "a hit ends the streak");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct MissStreak(u32);

impl MissStreak {
    /// No miss yet.
    pub const fn new() -> Self {
        MissStreak(0)
    }

    /// The memo held what it was asked for: the streak ends.
    pub fn hit(&mut self) {
        if self.0 != 0 {
            self.0 = 0;
        }
    }

    /// The memo did not hold it; whether to remember it, for a memo of `keep` entries.
    pub fn miss(&mut self, keep: usize) -> bool {
        self.0 = self.0.saturating_add(1);
        u64::from(self.0) <= 4 * keep as u64 || self.0.is_multiple_of(8)
    }
}

/// The value for `text`: remembered in `memo` (which keeps the last `keep` texts it
/// remembered), or computed by `compute` and then remembered if it succeeded. A memo that
/// keeps missing remembers one miss in eight (see [`MissStreak`]). A memo that is gone (the
/// thread is ending) only means computing.
///
/// # Examples
/// ```
/// use soulbase_net_core::recent::{recall, Recent};
///
/// thread_local! {
///     static LENGTHS: Recent<usize> = const { Recent::new() };
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
    let keep = keep.max(1);
    let print = fingerprint(text);
    // `Some(remember)` on a miss, `None` when the memo is gone.
    let looked = memo.try_with(|recent| {
        let mut memo = recent.memo.borrow_mut();
        let hit = memo
            .entries
            .iter()
            .find(|e| e.print == print && *e.text == *text)
            .map(|e| e.value.clone());
        match hit {
            Some(value) => {
                memo.misses.hit();
                Ok(value)
            }
            None => Err(memo.misses.miss(keep)),
        }
    });
    let remember = match looked {
        Ok(Ok(value)) => return Ok(value),
        Ok(Err(remember)) => remember,
        Err(_) => false,
    };
    let value = compute(text)?;
    if remember {
        let _ = memo.try_with(|recent| {
            let mut memo = recent.memo.borrow_mut();
            let entry = Entry {
                print,
                text: text.into(),
                value: value.clone(),
            };
            if memo.entries.len() < keep {
                memo.entries.push(entry);
            } else {
                let slot = memo.next % memo.entries.len();
                memo.entries[slot] = entry;
                memo.next = (slot + 1) % keep;
            }
        });
    }
    Ok(value)
}

/// A few of `text`'s bytes folded into a word: its length, the eight bytes after a URL's
/// `http://`, eight from the middle and the last eight. Texts with different fingerprints
/// differ; equal ones are compared in full.
fn fingerprint(text: &str) -> u64 {
    let b = text.as_bytes();
    let n = b.len();
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    if n < 16 {
        // Short texts: their length only (the whole text is compared anyway).
        return n as u64;
    }
    // `n >= 16`, so every window below lies inside the text.
    let after_scheme = word(7);
    let middle = word(n / 2 - 4);
    let end = word(n - 8);
    (n as u64) ^ after_scheme ^ middle.rotate_left(21) ^ end.rotate_left(42)
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static MEMO: Recent<String> = const { Recent::new() };
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

    thread_local! {
        static SAMPLED: Recent<usize> = const { Recent::new() };
        static PRINTS: Recent<String> = const { Recent::new() };
    }

    #[test]
    fn texts_that_share_a_fingerprint_are_told_apart_by_their_text() {
        // Same length, and the same bytes in every window the fingerprint reads.
        let a = "http://h1.example.test:8080/some/long/path/a-b";
        let b = "http://h1.example.test:8080/some/lonG/path/a-b";
        assert_eq!(a.len(), b.len());
        assert_eq!(fingerprint(a), fingerprint(b));
        // Short texts: the length only.
        assert_eq!(fingerprint("abc"), fingerprint("xyz"));
        // Different hosts of one length differ in the word after the scheme.
        assert_ne!(
            fingerprint("http://h1.bench.test:40000/"),
            fingerprint("http://h2.bench.test:40000/")
        );
        let id = |t: &str| Ok::<_, ()>(t.to_owned());
        for _ in 0..2 {
            for t in [a, b, "abc", "xyz"] {
                assert_eq!(recall(&PRINTS, 4, t, id).unwrap(), t);
            }
        }
    }

    #[test]
    fn a_memo_that_keeps_missing_remembers_one_miss_in_eight_then_settles() {
        let computed = std::cell::Cell::new(0);
        let len = |t: &str| {
            computed.set(computed.get() + 1);
            Ok::<_, ()>(t.len())
        };
        // 100 distinct texts: far past 4 × keep misses in a row.
        for i in 0..100 {
            recall(&SAMPLED, 2, &format!("text {i}"), len).unwrap();
        }
        // Miss 101: not one of the sampled ones, so not remembered.
        computed.set(0);
        recall(&SAMPLED, 2, "again", len).unwrap();
        recall(&SAMPLED, 2, "again", len).unwrap();
        assert_eq!(computed.get(), 2, "misses 101 and 102 are not remembered");
        // A working set of two settles within a few calls: miss 104 (b) is sampled, its hit
        // ends the streak, and the next miss (a) is remembered at once.
        computed.set(0);
        for _ in 0..4 {
            recall(&SAMPLED, 2, "a", len).unwrap();
            recall(&SAMPLED, 2, "b", len).unwrap();
        }
        assert_eq!(
            computed.get(),
            4,
            "a (miss 103), b (104, kept), a (105), b (hit), a (kept)"
        );
        computed.set(0);
        for _ in 0..10 {
            recall(&SAMPLED, 2, "a", len).unwrap();
            recall(&SAMPLED, 2, "b", len).unwrap();
        }
        assert_eq!(computed.get(), 0, "both remembered");
    }
}
