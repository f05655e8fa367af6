//! The interceptors of a client, listed per hook.
//!
//! Why: a hook an interceptor does not implement still costs a boxed future per request
//! when called (`async_trait`); listing each interceptor only under the hooks it names in
//! [`Interceptor::hooks`] makes those calls free.

use std::sync::Arc;

use soulbase_net_core::{Hooks, Interceptor};

/// How an interceptor's `before` is called: in place ([`Interceptor::before_now`], named
/// by [`Hooks::BEFORE_NOW`]) or awaited ([`Interceptor::before`]).
pub(super) enum Before {
    Now(Arc<dyn Interceptor>),
    Later(Arc<dyn Interceptor>),
}

/// The interceptors in the order the client was given them, once per hook they implement.
#[derive(Default)]
pub(super) struct Chain {
    len: usize,
    pub(super) before: Vec<Before>,
    pub(super) respond: Vec<Arc<dyn Interceptor>>,
    pub(super) on_attempt: Vec<Arc<dyn Interceptor>>,
    pub(super) should_resend: Vec<Arc<dyn Interceptor>>,
    pub(super) after: Vec<Arc<dyn Interceptor>>,
    pub(super) on_error: Vec<Arc<dyn Interceptor>>,
    /// The first dedup window an interceptor keeps ([`Interceptor::dedup_window`]).
    pub(super) dedup_window: Option<std::time::Duration>,
}

impl Chain {
    pub(super) fn new(interceptors: Vec<Arc<dyn Interceptor>>) -> Self {
        let mut chain = Chain {
            len: interceptors.len(),
            ..Chain::default()
        };
        for interceptor in interceptors {
            chain.dedup_window = chain.dedup_window.or_else(|| interceptor.dedup_window());
            let hooks = interceptor.hooks();
            if hooks.contains(Hooks::BEFORE_NOW) {
                chain.before.push(Before::Now(Arc::clone(&interceptor)));
            } else if hooks.contains(Hooks::BEFORE) {
                chain.before.push(Before::Later(Arc::clone(&interceptor)));
            }
            let lists = [
                (Hooks::RESPOND, &mut chain.respond),
                (Hooks::ON_ATTEMPT, &mut chain.on_attempt),
                (Hooks::SHOULD_RESEND, &mut chain.should_resend),
                (Hooks::AFTER, &mut chain.after),
                (Hooks::ON_ERROR, &mut chain.on_error),
            ];
            for (hook, list) in lists {
                if hooks.contains(hook) {
                    list.push(Arc::clone(&interceptor));
                }
            }
        }
        chain
    }

    /// How many interceptors the client was given.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Only(Hooks);
    impl Interceptor for Only {
        fn hooks(&self) -> Hooks {
            self.0
        }
    }

    #[test]
    fn each_interceptor_is_listed_under_its_hooks_in_order() {
        let a: Arc<dyn Interceptor> = Arc::new(Only(Hooks::BEFORE | Hooks::ON_ATTEMPT));
        let b: Arc<dyn Interceptor> = Arc::new(Only(Hooks::ALL));
        let c: Arc<dyn Interceptor> = Arc::new(Only(Hooks::NONE));
        let d: Arc<dyn Interceptor> = Arc::new(Only(Hooks::BEFORE_NOW | Hooks::BEFORE));
        let chain = Chain::new(vec![a.clone(), b.clone(), c, d.clone()]);
        let same = |list: &[Arc<dyn Interceptor>], want: &[&Arc<dyn Interceptor>]| {
            list.len() == want.len() && list.iter().zip(want).all(|(x, y)| Arc::ptr_eq(x, y))
        };
        assert_eq!(chain.len(), 4);
        // In order; `before_now` in place of `before` for the one that names it.
        let before: Vec<(bool, &Arc<dyn Interceptor>)> = (chain.before.iter())
            .map(|b| match b {
                Before::Now(i) => (true, i),
                Before::Later(i) => (false, i),
            })
            .collect();
        assert_eq!(before.len(), 3);
        for ((now, got), (want_now, want)) in
            before
                .into_iter()
                .zip([(false, &a), (false, &b), (true, &d)])
        {
            assert_eq!(now, want_now);
            assert!(Arc::ptr_eq(got, want));
        }
        assert!(same(&chain.on_attempt, &[&a, &b]));
        for list in [
            &chain.respond,
            &chain.should_resend,
            &chain.after,
            &chain.on_error,
        ] {
            assert!(same(list, &[&b]));
        }
    }
}
