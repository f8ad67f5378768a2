//! Which side of a recycle this cluster plays, from the SliceGateways it holds.

use capstan_apis::networking::HostType;

/// The part a cluster plays in one recycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Holds `sliceGwServer` with host type Server: owns the state machine.
    Server,
    /// Holds `sliceGwClient` with host type Client: answers requests.
    Client,
}

/// The role from the host types of the local SliceGateways named `sliceGwServer` and
/// `sliceGwClient` (`None` when absent). Neither matching: the CR is not ours.
pub fn detect_role(
    server_gateway: Option<&HostType>,
    client_gateway: Option<&HostType>,
) -> Option<Role> {
    if server_gateway == Some(&HostType::Server) {
        Some(Role::Server)
    } else if client_gateway == Some(&HostType::Client) {
        Some(Role::Client)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_from_the_local_gateways_and_host_types() {
        let server = HostType::from("Server");
        let client = HostType::from("Client");
        assert_eq!(detect_role(Some(&server), None), Some(Role::Server));
        assert_eq!(detect_role(None, Some(&client)), Some(Role::Client));
        assert_eq!(detect_role(None, None), None);
        // A gateway with the right name but the other host type does not make the role.
        assert_eq!(detect_role(Some(&client), None), None);
        assert_eq!(detect_role(None, Some(&server)), None);
        assert_eq!(detect_role(Some(&HostType::from("server")), None), None);
    }
}
