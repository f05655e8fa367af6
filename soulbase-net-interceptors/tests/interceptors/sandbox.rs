//! SandboxGuard: refusals happen before anything is dialled.

use std::sync::Arc;

use soulbase_net_core::{ErrorKind, NetRequest};
use soulbase_net_interceptors::SandboxGuard;
use soulbase_net_policy::{Denied, SecurityPolicy};
use soulbase_net_testkit::{FaultServer, Reply};

use crate::support::client_with;

#[tokio::test]
async fn metadata_address_is_refused_with_no_dial() {
    let guard = SandboxGuard::new(&SecurityPolicy::default()).unwrap();
    // The client itself would let the metadata address through (and the test dialer would
    // refuse it off loopback): only the interceptor stands in the way.
    let (c, dialer) = client_with(vec![Arc::new(guard)], |p| {
        p.security
            .grants
            .cidrs
            .push("169.254.169.254/32".parse().unwrap());
    });
    let err = c
        .send(NetRequest::get("http://169.254.169.254/latest/meta-data/"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(err.code().as_str(), "AUTH.FORBIDDEN");
    assert!(err.find_source::<Denied>().is_some());
    assert!(dialer.dialled().is_empty());
}

#[tokio::test]
async fn allow_list_refuses_with_zero_server_hits_and_grants_pass() {
    let srv = FaultServer::http1()
        .route("/e", Reply::echo())
        .start()
        .await
        .unwrap();
    let mut listed = SecurityPolicy::default();
    listed.allow_hosts = Some(vec!["api.example.com".to_owned()]);
    listed.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    let (c, _) = client_with(vec![Arc::new(SandboxGuard::new(&listed).unwrap())], |_| {});
    let err = c.send(NetRequest::get(srv.url("/e"))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked);
    assert_eq!(srv.total_hits(), 0);
    assert_eq!(srv.connections(), 0);

    let mut granted = SecurityPolicy::default();
    granted.grants.cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    let (c, _) = client_with(vec![Arc::new(SandboxGuard::new(&granted).unwrap())], |_| {});
    assert_eq!(
        c.send(NetRequest::get(srv.url("/e"))).await.unwrap().status,
        200
    );
    assert_eq!(srv.hits("/e"), 1);

    let (c, _) = client_with(
        vec![Arc::new(
            SandboxGuard::new(&SecurityPolicy::default()).unwrap(),
        )],
        |_| {},
    );
    let err = c.send(NetRequest::get(srv.url("/e"))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Blocked, "loopback without a grant");
    assert_eq!(srv.hits("/e"), 1);
    srv.join().await;
}
