//! `worker.kubeslice.io/v1alpha1`: KubeSlice's WorkerSliceGwRecycler, the persisted state of a
//! gateway recycle (server instance writes `spec`, client instance writes `status`).

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::wire::wire_enum;

/// API group.
pub const GROUP: &str = "worker.kubeslice.io";
/// API version.
pub const VERSION: &str = "v1alpha1";

/// Recycler label: slice name.
pub const LABEL_SLICE_NAME: &str = "slice_name";
/// Recycler label: the server-side SliceGateway name.
pub const LABEL_SLICEGW_NAME: &str = "slicegw_name";

/// Event reason when the server asked for the new gateway deployment.
pub const EVENT_FSM_NEW_GW_SPAWNED: &str = "FSMNewGWSpawned";
/// Event reason when routing moved to the new gateways.
pub const EVENT_FSM_ROUTING_TABLE_UPDATED: &str = "FSMRoutingTableUpdated";
/// Event reason when the old gateway deployment was deleted.
pub const EVENT_FSM_DELETE_OLD_GW: &str = "FSMDeleteOldGW";

/// A make-before-break replacement of one gateway pair. Named after the old server deployment.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "worker.kubeslice.io",
    version = "v1alpha1",
    kind = "WorkerSliceGwRecycler",
    doc = "A make-before-break replacement of one slice gateway pair; the server instance writes spec, the client instance writes status.",
    plural = "workerslicegwrecyclers",
    singular = "workerslicegwrecycler",
    printcolumn = r#"{"name":"State","type":"string","description":"Step of the make-before-break recycle","jsonPath":".spec.state"}"#,
    printcolumn = r#"{"name":"Slice","type":"string","jsonPath":".spec.sliceName"}"#,
    printcolumn = r#"{"name":"Server Gateway","type":"string","description":"SliceGateway on the server cluster","jsonPath":".spec.sliceGwServer"}"#,
    printcolumn = r#"{"name":"Client Gateway","type":"string","description":"SliceGateway on the client cluster","jsonPath":".spec.sliceGwClient"}"#,
    printcolumn = r#"{"name":"Request","type":"string","description":"Work the server asks of the client","priority":1,"jsonPath":".spec.request"}"#,
    printcolumn = r#"{"name":"Response","type":"string","description":"The client's answer","priority":1,"jsonPath":".status.client.response"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    namespaced,
    status = "WorkerSliceGwRecyclerStatus",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSliceGwRecyclerSpec {
    /// SliceGateway name on the server cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gw_server: Option<String>,
    /// SliceGateway name on the client cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_gw_client: Option<String>,
    /// The old deployments being replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw_pair: Option<GwPair>,
    /// FSM state, written by the server instance only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// Work the server asks of the client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Request>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slice_name: Option<String>,
}

/// The pair of old gateway deployment names (`<slicegw>-<instance>-<generation>`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GwPair {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

/// Written by the client instance (`client.response`) and, for errors, by the server (`conditions`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSliceGwRecyclerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub servers_to_recycle: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recycled_servers: Option<Vec<String>>,
    /// Why a recycle is in `error_state` (Capstan addition; the reference has no conditions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
}

/// The client instance's answer to the current request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Response>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recycled_client: Option<String>,
}

impl WorkerSliceGwRecycler {
    /// The current state (`init` when unset, as the reference starts there).
    pub fn state(&self) -> State {
        self.spec.state.clone().unwrap_or(State::Init)
    }

    /// The current request, if any.
    pub fn request(&self) -> Option<&Request> {
        self.spec.request.as_ref()
    }

    /// The client's response, if any.
    pub fn response(&self) -> Option<&Response> {
        self.status.as_ref()?.client.as_ref()?.response.as_ref()
    }

    /// True when the client's response is at least `at_least` (a missing response is below all).
    pub fn response_reached(&self, at_least: &Response) -> bool {
        self.response().is_some_and(|r| r >= at_least)
    }

    /// True when SliceGateway `gateway` is this recycle's server or client side.
    pub fn involves(&self, gateway: &str) -> bool {
        let named = |side: &Option<String>| side.as_deref() == Some(gateway);
        named(&self.spec.slice_gw_server) || named(&self.spec.slice_gw_client)
    }

    /// True while this recycle of `gateway` (either side) has not finished: one at a time per
    /// gateway, for a trigger and for rebalancing alike.
    pub fn in_progress_for(&self, gateway: &str) -> bool {
        !self.state().is_terminal() && self.involves(gateway)
    }
}

wire_enum! {
    /// FSM states (`spec.state`).
    pub enum State {
        Init => "init",
        NewDeploymentCreated => "new_deployment_created_state",
        SliceRouterUpdated => "slicerouter_updated_state",
        OldDeploymentDeleted => "old_deployment_deleted_state",
        Error => "error_state",
        End => "end",
    }
}

impl State {
    /// `end` and `error_state` take no further events.
    pub fn is_terminal(&self) -> bool {
        matches!(self, State::End | State::Error)
    }
}

wire_enum! {
    /// FSM events.
    pub enum Event {
        VerifyNewDeploymentCreated => "verify_new_deployment_created",
        UpdateRoutingTable => "update_routing_table",
        DeleteOldGwDeployment => "delete_old_gw_deployment",
        OnError => "on_error",
        End => "end",
    }
}

wire_enum! {
    /// Requests from server to client (`spec.request`), ordered as declared; unknown strings
    /// (including `""`) sort before all.
    pub enum Request {
        None => "none",
        CreateNewDeployment => "create_new_deployment",
        UpdateRoutingTable => "update_routing_table",
        DeleteOldGwDeployment => "delete_old_gw_deployment",
    }
}

wire_enum! {
    /// Responses from client to server (`status.client.response`), ordered as declared; unknown
    /// strings (including `""`) sort before all.
    pub enum Response {
        None => "none",
        NewDeploymentCreated => "new_deployment_created",
        RoutingTableUpdated => "routing_table_updated",
        OldGwDeploymentDeleted => "old_gw_deployment_deleted",
    }
}

/// Orders a wire enum by declaration position, `Other` first (by string, so `Ord` agrees with `Eq`).
macro_rules! ordered_by_declaration {
    ($name:ident) => {
        impl $name {
            fn rank(&self) -> usize {
                match self {
                    $name::Other(_) => 0,
                    known => {
                        1 + $name::KNOWN
                            .iter()
                            .position(|k| k == known)
                            .unwrap_or_default()
                    }
                }
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> Ordering {
                match (self, other) {
                    ($name::Other(a), $name::Other(b)) => a.cmp(b),
                    _ => self.rank().cmp(&other.rank()),
                }
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }
    };
}

ordered_by_declaration!(Request);
ordered_by_declaration!(Response);

impl Request {
    /// The response that completes this request (`none` for `none`, `None` for unknown requests).
    pub fn expected_response(&self) -> Option<Response> {
        Some(match self {
            Request::None => Response::None,
            Request::CreateNewDeployment => Response::NewDeploymentCreated,
            Request::UpdateRoutingTable => Response::RoutingTableUpdated,
            Request::DeleteOldGwDeployment => Response::OldGwDeploymentDeleted,
            Request::Other(_) => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recycler_round_trips() {
        let input = json!({
            "apiVersion": "worker.kubeslice.io/v1alpha1", "kind": "WorkerSliceGwRecycler",
            "metadata": {"name": "red-a-b-0-0", "namespace": "kubeslice-project",
                         "labels": {"slice_name": "red", "slicegw_name": "red-a-b"}},
            "spec": {"sliceGwServer": "red-a-b", "sliceGwClient": "red-b-a",
                     "gwPair": {"serverId": "red-a-b-0-0", "clientId": "red-b-a-0-0"},
                     "state": "slicerouter_updated_state", "request": "update_routing_table", "sliceName": "red"},
            "status": {"client": {"response": "new_deployment_created", "recycledClient": "red-b-a-0-1"},
                       "serversToRecycle": ["a"], "recycledServers": ["b"],
                       "conditions": [{"type": "Failed", "status": "True", "reason": "Timeout", "message": "waited",
                                       "lastTransitionTime": "2026-11-29T10:00:00Z"}]}
        });
        let r: WorkerSliceGwRecycler = serde_json::from_value(input.clone()).expect("decodes");
        assert_eq!(serde_json::to_value(&r).expect("serialises"), input);
        assert_eq!(r.state(), State::SliceRouterUpdated);
        assert_eq!(r.request(), Some(&Request::UpdateRoutingTable));
        assert!(r.response_reached(&Response::NewDeploymentCreated));
        assert!(!r.response_reached(&Response::RoutingTableUpdated));
    }

    #[test]
    fn missing_state_is_init_and_missing_response_reaches_nothing() {
        let r = WorkerSliceGwRecycler::new("x", WorkerSliceGwRecyclerSpec::default());
        assert_eq!(r.state(), State::Init);
        assert!(!r.response_reached(&Response::None));
    }

    #[test]
    fn response_ordering_matches_the_reference() {
        let ordered: Vec<Response> = [
            "",
            "none",
            "new_deployment_created",
            "routing_table_updated",
            "old_gw_deployment_deleted",
        ]
        .into_iter()
        .map(Response::from)
        .collect();
        for pair in ordered.windows(2) {
            assert!(pair[0] < pair[1], "{:?} < {:?}", pair[0], pair[1]);
        }
        assert!(Response::from("bogus") < Response::None);
        assert!(Response::from("") < Response::from("bogus"));
        assert_eq!(
            Response::OldGwDeploymentDeleted.cmp(&Response::OldGwDeploymentDeleted),
            Ordering::Equal
        );
        let mut shuffled = vec![
            Response::OldGwDeploymentDeleted,
            Response::None,
            Response::from(""),
            Response::RoutingTableUpdated,
            Response::NewDeploymentCreated,
        ];
        shuffled.sort();
        assert_eq!(shuffled, ordered);
    }

    #[test]
    fn request_ordering_matches_the_reference() {
        let ordered: Vec<Request> = [
            "",
            "none",
            "create_new_deployment",
            "update_routing_table",
            "delete_old_gw_deployment",
        ]
        .into_iter()
        .map(Request::from)
        .collect();
        for pair in ordered.windows(2) {
            assert!(pair[0] < pair[1], "{:?} < {:?}", pair[0], pair[1]);
        }
        assert_eq!(
            Request::UpdateRoutingTable.expected_response(),
            Some(Response::RoutingTableUpdated)
        );
        assert_eq!(Request::from("x").expected_response(), None);
    }

    #[test]
    fn vocabulary_is_exact() {
        fn strings<T: ToString>(all: &[T]) -> Vec<String> {
            all.iter().map(ToString::to_string).collect()
        }
        assert_eq!(
            strings(State::KNOWN),
            [
                "init",
                "new_deployment_created_state",
                "slicerouter_updated_state",
                "old_deployment_deleted_state",
                "error_state",
                "end"
            ]
        );
        assert_eq!(
            strings(Event::KNOWN),
            [
                "verify_new_deployment_created",
                "update_routing_table",
                "delete_old_gw_deployment",
                "on_error",
                "end"
            ]
        );
        assert!(
            State::End.is_terminal() && State::Error.is_terminal() && !State::Init.is_terminal()
        );
    }

    #[test]
    fn a_recycle_is_in_progress_for_either_gateway_until_it_ends() {
        let mut cr: WorkerSliceGwRecycler = serde_json::from_value(json!({
            "apiVersion": "worker.kubeslice.io/v1alpha1", "kind": "WorkerSliceGwRecycler",
            "metadata": {"name": "red-a-b-0-0"},
            "spec": {"sliceGwServer": "red-a-b", "sliceGwClient": "red-b-a"}
        }))
        .expect("recycler");
        // No state yet is `init`: in progress.
        assert!(cr.in_progress_for("red-a-b") && cr.in_progress_for("red-b-a"));
        assert!(!cr.involves("red-a-c") && !cr.in_progress_for("red-a-c"));
        cr.spec.state = Some(State::from("old_deployment_deleted_state"));
        assert!(cr.in_progress_for("red-b-a"));
        for finished in ["end", "error_state"] {
            cr.spec.state = Some(State::from(finished));
            assert!(
                cr.involves("red-a-b") && !cr.in_progress_for("red-a-b"),
                "{finished}"
            );
        }
    }
}
