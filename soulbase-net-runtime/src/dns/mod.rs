//! Name resolution for the client: IP literals, static overrides, a TTL cache with
//! singleflight and serve-stale, persistence to a file, background refresh and prefetch
//! (seeds 000, 002, 004), over hickory-resolver.

mod background;
pub(crate) mod cache;
mod hickory;
mod load;
mod order;
mod persist;
mod writer;

pub use hickory::{hickory_resolver, HickoryOptions};
pub(crate) use persist::{frozen_path, load_frozen, save_frozen};
pub(crate) use writer::write_behind;
mod upstream;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use soulbase_net_core::{DnsSource, ErrorKind, NetError};
use soulbase_net_policy::DnsPolicy;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use self::cache::{CacheCfg, Caller, DnsCache, Source};
use self::load::LoadState;
use self::order::{order, parse_host, Host};
use self::upstream::{LookupError, Upstream};

/// The most names the cache holds; past it, expired entries and then those closest to expiry
/// are evicted, so a flood of distinct names cannot exhaust memory.
const MAX_NAMES: usize = 10_000;

/// How long dropping the last clone of a resolver waits for its last write (made on the
/// persistence writer's thread): long enough for any working disk, short enough that a
/// stalled one cannot hang a shutdown.
const DROP_WRITE_GRACE: Duration = Duration::from_secs(1);

/// The addresses of a host, in the order to try them, and where they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resolution {
    /// The addresses, shuffled when the policy says so and sorted for happy eyeballs: the
    /// preferred family first, then the families alternating (RFC 8305 §4). Never empty.
    pub addrs: Arc<[IpAddr]>,
    /// Where the answer came from: a lookup, the cache (fresh or stale), a static override or
    /// an IP literal.
    pub source: DnsSource,
    /// How long resolving took, waiting for another caller's lookup included.
    pub elapsed: Duration,
}

/// A caching DNS resolver driven by a [`DnsPolicy`].
///
/// [`DnsResolver::resolve`] answers, in order: IP literals (`10.0.0.1`, `[::1]`) as they are,
/// with no lookup; names in `static_hosts` (like curl `--resolve`); fresh cached answers; and
/// otherwise one lookup per name however many callers ask at once (singleflight). Answers are
/// cached for their TTL clamped to `[min_ttl, cache_ttl]`; when a lookup fails, an expired
/// answer is served for up to `stale_for` if `serve_stale` is on.
///
/// With `persist_file`, the cache is loaded from the file (expired entries are dropped, or
/// kept as stale within `stale_for`; an unreadable file is ignored and the cache starts cold),
/// written every `persist_interval`, and written once more when the last clone of the
/// resolver is dropped. Inside a Tokio runtime the file is read on the blocking pool, so
/// building a resolver (which a client may do on a request) never waits for a disk: the
/// resolver starts with an empty cache, and its first calls may look names up afresh while
/// the file loads; the loaded entries are merged in when they arrive, never replacing an
/// answer looked up meanwhile. [`DnsResolver::loaded`] waits for the load. Without a runtime,
/// the file is read in [`DnsResolver::new`]. No write is made before the load is done (a
/// write would replace entries not yet read): a periodic write waits for the next tick,
/// [`DnsResolver::persist`] waits for the load, and a resolver dropped before it is done
/// leaves the file as it was. The write at the last drop is made on a thread of its own (no
/// async worker waits for the disk); the drop waits for it up to one second, so on a working
/// disk the file is written when the drop returns and nothing is lost at a normal shutdown. A
/// write that takes longer (a stalled filesystem) goes on in the background and is lost if the
/// process exits first; the file is then the previous one, whole (writes are atomic). To be
/// sure of the last state, `persist().await` before the last drop.
///
/// Every `refresh_interval`, expired names that requests asked for since their last lookup are
/// looked up again (a name nobody asks for any more ages out after `stale_for` instead of
/// being kept warm forever); the `prefetch` names are looked up right after
/// [`DnsResolver::new`]. Both run in the
/// background with up to `resolve_retries` attempts `resolve_retry_delay` apart (each wait
/// randomised to 50–100 % of it). Background work needs a Tokio runtime when the resolver is
/// built; without one there is none. It stops when the resolver is dropped.
///
/// A request-path lookup is made once, within `timeout`: retrying there would only stretch
/// the request's own deadline, which the retry layer governs.
///
/// Cloning is cheap; clones share the cache.
///
/// # Examples
/// ```no_run
/// # async fn run() -> Result<(), soulbase_net_core::NetError> {
/// use soulbase_net_policy::DnsPolicy;
/// use soulbase_net_runtime::DnsResolver;
///
/// let resolver = DnsResolver::new(&DnsPolicy::default())?;
/// let res = resolver.resolve("api.example.com").await?;
/// println!("{:?} from {:?}", res.addrs, res.source);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DnsResolver {
    inner: Arc<Inner>,
}

struct Inner {
    cache: DnsCache<LookupError>,
    upstream: Upstream,
    static_hosts: HashMap<String, Arc<[IpAddr]>>,
    shuffle: bool,
    prefer_ipv6: bool,
    happy_eyeballs: bool,
    persist_file: Option<PathBuf>,
    resolve_retries: u32,
    resolve_retry_delay: Duration,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Whether the persisted cache has been read: until then no write is made, which would
    /// replace the file's entries with the few resolved meanwhile.
    loaded: LoadState,
}

// === impl DnsResolver ===

impl DnsResolver {
    /// Builds a resolver from `policy`, starts loading the persisted cache if there is one
    /// (in the background inside a Tokio runtime, see [`DnsResolver::loaded`]), and, when
    /// called inside a Tokio runtime, starts the background prefetch, refresh and persistence.
    ///
    /// # Errors
    /// `InvalidRequest` when a `static_hosts` name is not a valid host name; `Dns` when
    /// `nameservers` is empty and the system DNS configuration cannot be read.
    pub fn new(policy: &DnsPolicy) -> Result<Self, NetError> {
        let mut static_hosts = HashMap::new();
        for (name, ips) in &policy.static_hosts {
            if ips.is_empty() {
                continue;
            }
            if let Host::Name(name) = parse_host(name)? {
                static_hosts.insert(name, Arc::from(ips.as_slice()));
            }
        }
        let cfg = CacheCfg {
            min_ttl: policy.min_ttl,
            max_ttl: policy.cache_ttl,
            stale_for: if policy.serve_stale {
                policy.stale_for
            } else {
                Duration::ZERO
            },
            max_entries: MAX_NAMES,
        };
        let inner = Arc::new(Inner {
            cache: DnsCache::new(cfg),
            upstream: Upstream::new(policy)?,
            static_hosts,
            shuffle: policy.shuffle,
            prefer_ipv6: policy.prefer_ipv6,
            happy_eyeballs: policy.happy_eyeballs,
            persist_file: policy.persist_file.clone(),
            resolve_retries: policy.resolve_retries,
            resolve_retry_delay: policy.resolve_retry_delay,
            tasks: Mutex::new(Vec::new()),
            loaded: LoadState::pending(),
        });
        load::start(&inner);
        background::start(&inner, policy);
        Ok(DnsResolver { inner })
    }

    /// Resolves `host` (a name or an IP literal) to the addresses to connect to.
    ///
    /// # Errors
    /// - `InvalidRequest`: `host` is not a valid host name, or looks numeric without being a
    ///   canonical IP address (`127.1`);
    /// - `Timeout(Dns)`: no answer within the policy's `timeout`;
    /// - `Dns`: the name does not exist, has no addresses, or the name server failed — and no
    ///   stale answer could be served.
    pub async fn resolve(&self, host: &str) -> Result<Resolution, NetError> {
        let start = Instant::now();
        let name = match parse_host(host)? {
            Host::Ip(ip) => {
                return Ok(Resolution {
                    addrs: Arc::from([ip]),
                    source: DnsSource::Literal,
                    elapsed: start.elapsed(),
                })
            }
            Host::Name(name) => name,
        };
        let (addrs, source) = match self.inner.static_hosts.get(&name) {
            Some(addrs) => (addrs.clone(), DnsSource::Static),
            None => {
                let (addrs, source) = self
                    .inner
                    .lookup(&name, Caller::Request)
                    .await
                    .map_err(|e| e.to_net_error(&name))?;
                let source = match source {
                    Source::Cache => DnsSource::Cache,
                    Source::Lookup => DnsSource::Lookup,
                    Source::Stale => DnsSource::Stale,
                };
                (addrs, source)
            }
        };
        let inner = &self.inner;
        let addrs = order(
            &addrs,
            inner.shuffle,
            inner.prefer_ipv6,
            inner.happy_eyeballs,
        );
        Ok(Resolution {
            addrs: addrs.into(),
            source,
            elapsed: start.elapsed(),
        })
    }

    /// Writes the cache to the policy's `persist_file` now; does nothing without one. Waits
    /// for the file to be loaded first (see [`DnsResolver::loaded`]), so that the write keeps
    /// what the file held.
    ///
    /// # Errors
    /// `Io` when the file cannot be written.
    pub async fn persist(&self) -> Result<(), NetError> {
        let Some(path) = self.inner.persist_file.clone() else {
            return Ok(());
        };
        self.loaded().await;
        let entries = self.inner.cache.snapshot();
        tokio::task::spawn_blocking(move || persist::save(&path, &entries))
            .await
            .map_err(|e| {
                NetError::new(ErrorKind::Io)
                    .with_message("the dns cache writer stopped")
                    .with_source(e)
            })?
    }

    /// Waits until the policy's `persist_file` has been loaded into the cache (or found
    /// unreadable); returns at once without one, or when the resolver was built outside a
    /// Tokio runtime (the file was then read in [`DnsResolver::new`]).
    ///
    /// Calls need not wait for it: until the load is done, names are looked up afresh.
    pub async fn loaded(&self) {
        self.inner.loaded.wait().await;
    }

    /// How many names the cache holds (fresh or stale); static overrides are not counted.
    pub fn cached_names(&self) -> usize {
        self.inner.cache.len()
    }
}

impl fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("DnsResolver")
            .field("upstream", &inner.upstream)
            .field("cached_names", &inner.cache.len())
            .field("static_hosts", &inner.static_hosts.len())
            .field("persist_file", &inner.persist_file)
            .finish_non_exhaustive()
    }
}

// === impl Inner ===

impl Inner {
    /// A normalised name through the cache: a fresh answer, or one singleflight lookup.
    async fn lookup(
        &self,
        name: &str,
        caller: Caller,
    ) -> Result<(Arc<[IpAddr]>, Source), LookupError> {
        self.cache
            .resolve(name, caller, || self.upstream.lookup(name))
            .await
    }
}

impl DnsResolver {
    /// Whether anything but the one holder asking (a client's map of resolvers) holds this
    /// resolver: its background tasks hold it only weakly.
    pub(crate) fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
        if !self.loaded.is_done() {
            // The file was never read (a stalled disk, or a resolver dropped at once):
            // writing it would replace its entries with the few resolved meanwhile.
            return;
        }
        if let Some(path) = self.persist_file.clone() {
            // The last write, on the persistence writer's thread: the dropping thread may be
            // an async worker, which must not wait for a disk (see `DROP_WRITE_GRACE`).
            let entries = self.cache.snapshot();
            let written =
                writer::write_behind("the dns cache file", move || persist::save(&path, &entries));
            if !written.wait(DROP_WRITE_GRACE) {
                tracing::warn!("the dns cache file is still being written; not waiting for it");
            }
        }
    }
}
