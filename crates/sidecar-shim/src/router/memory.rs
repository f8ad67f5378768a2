//! Routes kept in this process: for tests, the demo, and machines without CAP_NET_ADMIN.

use std::collections::BTreeMap;
use std::sync::Mutex;

use capstan_proto::router::ConnectionInfo;

use super::{NextHops, RouterBackend};
use crate::backend::BackendError;
use crate::net::Cidr;

/// A route table and a fixed list of client connections.
#[derive(Debug, Default)]
pub struct MemoryRouter {
    routes: Mutex<BTreeMap<Cidr, NextHops>>,
    connections: Vec<ConnectionInfo>,
}

impl MemoryRouter {
    pub fn new(connections: Vec<ConnectionInfo>) -> Self {
        Self {
            routes: Mutex::default(),
            connections,
        }
    }

    /// A copy of the route table.
    pub fn routes(&self) -> BTreeMap<Cidr, NextHops> {
        self.table().clone()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<Cidr, NextHops>> {
        // The table is always consistent between statements, so a poisoned lock is still usable.
        self.routes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[tonic::async_trait]
impl RouterBackend for MemoryRouter {
    async fn next_hops(&self, dst: Cidr) -> Result<Option<NextHops>, BackendError> {
        Ok(self.table().get(&dst).cloned())
    }

    async fn replace_route(&self, dst: Cidr, next_hops: &NextHops) -> Result<(), BackendError> {
        self.table().insert(dst, next_hops.clone());
        Ok(())
    }

    async fn delete_route(&self, dst: Cidr) -> Result<(), BackendError> {
        self.table().remove(&dst);
        Ok(())
    }

    async fn connections(&self) -> Result<Vec<ConnectionInfo>, BackendError> {
        Ok(self.connections.clone())
    }
}

/// Parses `POD,INTERFACE,NSM_IP,NSM_PEER_IP` (the `--client-connection` flag).
pub fn parse_connection(text: &str) -> Result<ConnectionInfo, String> {
    let fields: Vec<&str> = text.split(',').map(str::trim).collect();
    let [pod_name, nsm_interface, nsm_ip, nsm_peer_ip] = fields.as_slice() else {
        return Err(format!(
            "expected POD,INTERFACE,NSM_IP,NSM_PEER_IP, got {text:?}"
        ));
    };
    for ip in [nsm_ip, nsm_peer_ip] {
        if crate::net::parse_ip(ip).is_none() {
            return Err(format!("{ip:?} is not an IP address"));
        }
    }
    Ok(ConnectionInfo {
        pod_name: (*pod_name).to_owned(),
        nsm_interface: (*nsm_interface).to_owned(),
        nsm_ip: (*nsm_ip).to_owned(),
        nsm_peer_ip: (*nsm_peer_ip).to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_flag_parses() {
        let conn = parse_connection("app-1, nsm0,10.1.2.1,10.1.2.2").expect("valid");
        assert_eq!(conn.pod_name, "app-1");
        assert_eq!(conn.nsm_interface, "nsm0");
        assert_eq!(conn.nsm_ip, "10.1.2.1");
        assert_eq!(conn.nsm_peer_ip, "10.1.2.2");
        assert!(parse_connection("app-1,nsm0,10.1.2.1").is_err());
        assert!(parse_connection("app-1,nsm0,10.1.2.1,peer").is_err());
    }
}
