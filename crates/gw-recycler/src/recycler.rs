//! The recycler reconcile of one WorkerSliceGwRecycler: detect this cluster's role, observe the
//! local side (caches plus sidecar probes) into `gw-recycler-core` facts, decide, and perform the
//! one action. The server writes only `spec` (state, request) and the client only
//! `status.client`; both writes carry the resourceVersion they were decided on, so a conflict
//! means "re-read and decide again" (the next pass).

use std::time::Duration;

use capstan_apis::networking::SliceGateway;
use capstan_apis::worker::WorkerSliceGwRecycler;
use capstan_runtime::kube_errors::is_not_found;
use gw_recycler_core::decide::{
    ClientAction, ClientFacts, DeploymentFacts, Missing, PodFacts, Probes, RouteProbe,
    ServerAction, ServerFacts, SideFacts, Timing, after_work, decide_client, decide_server,
};
use gw_recycler_core::naming::next_deployment_name;
use gw_recycler_core::role::{Role, detect_role};
use gw_recycler_core::{Request, State, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::error::ReconcileError;
use crate::metrics::RecyclerMetrics;
use crate::ops::{LocalSide, published_nsm_ip, write_params};
use crate::sidecars::Sidecars;
use crate::world::{World, is_excluded, is_marked_for_deletion};
use capstan_runtime::lean::LeanApi;

/// Annotation (RFC 3339) recording when the server wrote the current state: the step timeout,
/// drain delay and retention count from it, across restarts.
pub const ANNOTATION_STATE_SINCE: &str = "capstan.io/state-since";

/// Annotation holding why the server put the recycle in `error_state` (the step and the missing
/// condition), written with the state so the status condition can always follow.
pub const ANNOTATION_FAILURE: &str = "capstan.io/failure";

/// Annotation (RFC 3339) recording when the failure in [`ANNOTATION_FAILURE`] was announced (its
/// Warning Event and `Failed` condition). Metadata, not status: kubeslice-controller's CRD has no
/// `status.conditions` and a real hub prunes them, so a condition cannot say whether the failure
/// was announced, and every pass would announce it again.
pub const ANNOTATION_FAILURE_REPORTED: &str = "capstan.io/failure-reported";

/// Annotation (RFC 3339) on a failed recycle: rebalancing holds its SliceGateway until then (see
/// `gw_recycler_core::rebalance::failed_recycle`); written with the Event that says so, once.
pub const ANNOTATION_REBALANCE_HELD_UNTIL: &str = "capstan.io/rebalance-held-until";

/// Warning Event reason when rebalancing leaves a failed recycle alone until its retention passed.
pub const EVENT_REBALANCE_HELD: &str = "RebalanceHeld";

/// Status condition type of a failed recycle (kept where the CRD has `status.conditions`, as
/// Capstan's own does; pruned on kubeslice-controller's).
pub const CONDITION_FAILED: &str = "Failed";

/// Why `cr` is in error_state, while that failure is not announced yet.
pub fn unrecorded_failure(cr: &WorkerSliceGwRecycler) -> Option<&str> {
    if cr.state() != State::Error || cr.annotations().contains_key(ANNOTATION_FAILURE_REPORTED) {
        return None;
    }
    cr.annotations().get(ANNOTATION_FAILURE).map(String::as_str)
}

/// Warning Event reason when a recycle enters `error_state`.
pub const EVENT_FSM_ERROR: &str = "FSMErrorState";

/// Which roles this instance may play (`--role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    Auto,
    Only(Role),
}

pub struct Recycler {
    pub hub: kube::Client,
    pub hub_namespace: String,
    pub worker: kube::Client,
    pub namespace: String,
    pub allowed: Allowed,
    pub timing: Timing,
    pub sidecars: Sidecars,
    pub recorder: Recorder,
    pub metrics: RecyclerMetrics,
    pub manager: String,
}

/// When a pass that performed work looks again: at once. Its writes show through the caches'
/// stand-ins and its gRPC calls have returned, so the next pass sees what it did and moves on
/// (or waits on the step's own condition, with that condition's ladder).
pub const AFTER_WORK: Duration = Duration::ZERO;

/// The part of a WorkerSliceGwRecycler a write sets: the server's `spec` (state, request), the
/// `Failed` condition, or the client's response (both in `status`).
#[derive(Debug, Clone, Copy)]
enum CrPart {
    State,
    Condition,
    FailureReported,
    Response,
}

/// What a pass of one CR left to do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Waiting on this condition, which only a probe notices: re-check on the probe ladder.
    pub probing: Option<&'static str>,
    /// Re-check after this: a wait on time, or [`AFTER_WORK`].
    pub recheck_after: Option<Duration>,
    /// Something was written.
    pub progressed: bool,
    /// Work was done on this local SliceGateway's objects: its reconciler has something to do.
    pub worked_on: Option<String>,
}

fn parse_time(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

pub(crate) fn state_since(cr: &WorkerSliceGwRecycler) -> Option<Timestamp> {
    cr.annotations()
        .get(ANNOTATION_STATE_SINCE)
        .and_then(|t| parse_time(t))
        .or_else(|| cr.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

impl Recycler {
    fn side<'a>(&'a self, world: &'a World, gateway: &'a str) -> LocalSide<'a> {
        LocalSide {
            client: &self.worker,
            namespace: &self.namespace,
            gateway,
            world,
            sidecars: &self.sidecars,
            manager: &self.manager,
        }
    }

    /// This cluster's role for `cr`, if any.
    pub fn role(&self, world: &World, cr: &WorkerSliceGwRecycler) -> Option<Role> {
        let host = |name: &Option<String>| {
            name.as_deref()
                .and_then(|n| world.gateway(n))
                .and_then(|g| g.host_type().cloned())
        };
        let role = detect_role(
            host(&cr.spec.slice_gw_server).as_ref(),
            host(&cr.spec.slice_gw_client).as_ref(),
        )?;
        match self.allowed {
            Allowed::Only(only) if only != role => None,
            _ => Some(role),
        }
    }

    #[tracing::instrument(skip_all, fields(recycler = %cr.name_any(), state = %cr.state()))]
    pub async fn reconcile(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        now: Timestamp,
    ) -> Result<Outcome, ReconcileError> {
        let Some(role) = self.role(world, cr) else {
            return Ok(Outcome::default());
        };
        let pair = cr.spec.gw_pair.clone().unwrap_or_default();
        let (gateway, old) = match role {
            Role::Server => (cr.spec.slice_gw_server.clone(), pair.server_id),
            Role::Client => (cr.spec.slice_gw_client.clone(), pair.client_id),
        };
        let (Some(gateway), Some(old)) = (gateway, old) else {
            return Ok(Outcome::default());
        };
        if cr.state().is_terminal() && role == Role::Client {
            return Ok(Outcome::default());
        }
        let probes = match role {
            Role::Server => Probes::for_server(&cr.state()),
            Role::Client => Probes::for_client(cr.request()),
        };
        let side = self.observe(world, &gateway, &old, probes).await;
        match role {
            Role::Server => self.serve(world, cr, &gateway, side, now).await,
            Role::Client => self.answer(world, cr, &gateway, side).await,
        }
    }

    /// The facts of the local side: deployments from the caches, NSM IPs as the SliceGateway
    /// publishes them, and routes from the router sidecar, of the gateways `probes` names (the
    /// rest no decision at this step reads).
    async fn observe(&self, world: &World, gateway: &str, old: &str, probes: Probes) -> SideFacts {
        let new = next_deployment_name(old);
        let gw = world.gateway(gateway);
        let intermediate = gw
            .as_ref()
            .map(|g| g.intermediate_deployments().to_vec())
            .unwrap_or_default();
        let facts = |name: &str, read_nsm_ip: bool| {
            deployment_facts(world, gw.as_deref(), name, &intermediate, read_nsm_ip)
        };
        let (old_facts, new_facts) = (
            facts(old, probes.old_gateway),
            facts(&new, probes.new_gateway),
        );
        let router = gw
            .as_deref()
            .and_then(|g| self.side(world, gateway).router_and_subnet(g).ok());
        let nsm = |d: &DeploymentFacts| d.pod.as_ref().and_then(|p| p.nsm_ip.clone());
        let (new_ip, old_ip) = (nsm(&new_facts), nsm(&old_facts));
        // The two route checks are independent: made at once, a pass costs one gRPC round trip.
        let (route_via_new, route_via_old) = futures::join!(
            self.probe(router.as_ref(), new_ip.as_deref()),
            self.probe(router.as_ref(), old_ip.as_deref()),
        );
        SideFacts {
            old_deployment: old.to_owned(),
            new_deployment: new,
            old: old_facts,
            new: new_facts,
            route_via_new,
            route_via_old,
        }
    }

    async fn probe(&self, router: Option<&(String, String)>, nsm_ip: Option<&str>) -> RouteProbe {
        let Some((router, subnet)) = router else {
            return RouteProbe::Unreachable;
        };
        let Some(nsm_ip) = nsm_ip else {
            return RouteProbe::Absent;
        };
        match self.sidecars.route_present(router, subnet, nsm_ip).await {
            Ok(true) => RouteProbe::Present,
            Ok(false) => RouteProbe::Absent,
            Err(error) if error.is_unreachable() => {
                tracing::debug!(%error, "router sidecar not answering");
                RouteProbe::Unreachable
            }
            Err(error) => {
                tracing::warn!(%error, "router sidecar answered the route check with an error");
                RouteProbe::Failed
            }
        }
    }

    async fn serve(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        gateway: &str,
        side: SideFacts,
        now: Timestamp,
    ) -> Result<Outcome, ReconcileError> {
        let api: Api<WorkerSliceGwRecycler> =
            Api::namespaced(self.hub.clone(), &self.hub_namespace);
        if let Some(message) = unrecorded_failure(cr) {
            self.record_failure(world, cr, message.to_owned(), now)
                .await?;
            return Ok(Outcome {
                progressed: true,
                ..Outcome::default()
            });
        }
        let facts = ServerFacts {
            state: cr.state(),
            response: cr.response().cloned(),
            state_since: state_since(cr),
            side,
        };
        let action = decide_server(&facts, &self.timing, now);
        tracing::debug!(?action, "server decision");
        let name = cr.name_any();
        match action {
            ServerAction::Nothing => Ok(Outcome::default()),
            ServerAction::Work(work) => {
                self.side(world, gateway).perform(&work).await?;
                // Init moves on without waiting: the advance needs no new observation.
                if let Some(ServerAction::Advance {
                    to,
                    request,
                    reason,
                    ..
                }) = after_work(&facts, &work, &self.timing, now)
                {
                    self.advance(world, cr, &facts.state, (to, request, reason), now)
                        .await?;
                }
                Ok(Outcome {
                    recheck_after: Some(AFTER_WORK),
                    progressed: true,
                    worked_on: Some(gateway.to_owned()),
                    ..Outcome::default()
                })
            }
            ServerAction::Advance {
                to,
                request,
                reason,
                ..
            } => {
                self.advance(world, cr, &facts.state, (to, request, reason), now)
                    .await?;
                Ok(Outcome {
                    progressed: true,
                    ..Outcome::default()
                })
            }
            ServerAction::Wait {
                missing,
                recheck_after,
            } => {
                tracing::debug!(missing = missing.metric_label(), "waiting");
                Ok(Outcome {
                    // No recheck time: a condition only a probe notices (see `Missing::needs_probe`).
                    probing: recheck_after.is_none().then(|| missing.metric_label()),
                    recheck_after: recheck_after.map(|d| {
                        // Re-check at most every step timeout, so the timeout also fires when idle.
                        d.min(self.timing.step_timeout)
                    }),
                    ..Outcome::default()
                })
            }
            ServerAction::Fail { step, missing } => {
                let message = format!(
                    "step {step} timed out after {}s waiting for: {}",
                    self.timing.step_timeout.as_secs(),
                    missing.describe()
                );
                // The reason travels with the state write, so a crash before the condition is
                // written loses nothing: the next pass in error_state writes it from here.
                self.write_state(world, cr, &State::Error, None, now, Some(&message))
                    .await?;
                self.metrics.transition(&facts.state, &State::Error);
                self.metrics.finished(cr, "error", now);
                tracing::warn!(%message, "recycle failed");
                self.record_failure(world, cr, message, now).await?;
                Ok(Outcome {
                    progressed: true,
                    ..Outcome::default()
                })
            }
            ServerAction::DeleteFinished => {
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => tracing::info!("finished recycle deleted after its retention"),
                    Err(e) if is_not_found(&e) => {}
                    Err(source) => {
                        return Err(ReconcileError::DeleteFinished {
                            recycler: name,
                            source,
                        });
                    }
                }
                Ok(Outcome::default())
            }
        }
    }

    /// Performs a [`ServerAction::Advance`] out of `from` to `to`, posting `request`: the state
    /// write, its metrics and the reference's Event (`reason`).
    async fn advance(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        from: &State,
        (to, request, reason): (State, Request, Option<&'static str>),
        now: Timestamp,
    ) -> Result<(), ReconcileError> {
        self.write_state(world, cr, &to, Some(request.as_str()), now, None)
            .await?;
        self.metrics.transition(from, &to);
        if to == State::End {
            self.metrics.finished(cr, "end", now);
        }
        if let Some(reason) = reason {
            let note = format!("{from} -> {to}");
            self.announce(cr, EventType::Normal, reason, note).await;
        }
        Ok(())
    }

    /// Writes `spec.state` (and `spec.request`) at the resourceVersion decided on.
    async fn write_state(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        to: &State,
        request: Option<&str>,
        now: Timestamp,
        failure: Option<&str>,
    ) -> Result<(), ReconcileError> {
        let mut spec = json!({"state": to.as_str()});
        if let Some(request) = request {
            spec["request"] = json!(request);
        }
        let mut annotations = json!({ANNOTATION_STATE_SINCE: now.to_string()});
        if let Some(failure) = failure {
            annotations[ANNOTATION_FAILURE] = json!(failure);
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": cr.metadata.resource_version,
                "annotations": annotations
            },
            "spec": spec
        });
        self.patch_cr(world, cr, CrPart::State, &patch).await?;
        tracing::info!(from = %cr.state(), %to, "state written");
        Ok(())
    }

    /// The `Failed` status condition (reason `StepTimeout`, the message naming the step and the
    /// missing condition) and the Warning Event of a recycle in error_state, then the annotation
    /// saying they went out: once per failure (a crash before the annotation repeats them once).
    async fn record_failure(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        message: String,
        now: Timestamp,
    ) -> Result<(), ReconcileError> {
        let condition = Condition {
            type_: CONDITION_FAILED.into(),
            status: "True".into(),
            reason: "StepTimeout".into(),
            message: message.clone(),
            last_transition_time: Time(now),
            observed_generation: cr.metadata.generation,
        };
        let patch = json!({"status": {"conditions": [condition]}});
        self.patch_cr(world, cr, CrPart::Condition, &patch).await?;
        self.announce(cr, EventType::Warning, EVENT_FSM_ERROR, message)
            .await;
        let reported = json!({"metadata": {"annotations": {
            ANNOTATION_FAILURE_REPORTED: now.to_string()
        }}});
        self.patch_cr(world, cr, CrPart::FailureReported, &reported)
            .await
    }

    /// Says (once per failure) that rebalancing leaves the failed recycle `cr` alone until
    /// `until`, instead of deleting and recreating it in a loop.
    pub(crate) async fn hold_rebalancing(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        deployment: &str,
        until: Timestamp,
    ) -> Result<(), ReconcileError> {
        if cr
            .annotations()
            .contains_key(ANNOTATION_REBALANCE_HELD_UNTIL)
        {
            return Ok(());
        }
        let note = format!(
            "rebalancing would recycle {deployment}, but recycle {} failed: it is not retried \
             before {until} (--retention after the failure); delete it to let rebalancing retry now",
            cr.name_any()
        );
        self.announce(cr, EventType::Warning, EVENT_REBALANCE_HELD, note)
            .await;
        let held = json!({"metadata": {"annotations": {
            ANNOTATION_REBALANCE_HELD_UNTIL: until.to_string()
        }}});
        self.patch_cr(world, cr, CrPart::FailureReported, &held)
            .await
    }

    async fn answer(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        gateway: &str,
        side: SideFacts,
    ) -> Result<Outcome, ReconcileError> {
        let (old, new) = (side.old_deployment.clone(), side.new_deployment.clone());
        let facts = ClientFacts {
            state: cr.state(),
            request: cr.request().cloned(),
            response: cr.response().cloned(),
            side,
        };
        let action = decide_client(&facts);
        tracing::debug!(?action, "client decision");
        match action {
            ClientAction::Nothing => Ok(Outcome::default()),
            ClientAction::Work(work) => {
                self.side(world, gateway).perform(&work).await?;
                Ok(Outcome {
                    recheck_after: Some(AFTER_WORK),
                    progressed: true,
                    worked_on: Some(gateway.to_owned()),
                    ..Outcome::default()
                })
            }
            ClientAction::Wait(Missing::OldDeploymentPresent) => {
                // Only this side knows: the server sees no answer until its step timeout. A
                // Deployment's watch event brings the next look, so no probing (and one line
                // per look, not one per second).
                tracing::warn!(
                    deployment = %old,
                    "the recycle names a gateway deployment this cluster does not have; waiting \
                     for it (a recycle names the client gateway's current generation)"
                );
                Ok(Outcome::default())
            }
            ClientAction::Wait(missing) => {
                tracing::debug!(missing = missing.metric_label(), "waiting");
                // The rest comes with a watch event; the client has no step timeout to keep.
                Ok(Outcome {
                    probing: missing.needs_probe().then(|| missing.metric_label()),
                    ..Outcome::default()
                })
            }
            ClientAction::Respond(response) => {
                let patch = json!({
                    "metadata": {"resourceVersion": cr.metadata.resource_version},
                    "status": {"client": {"response": response.as_str(), "recycledClient": new}}
                });
                self.patch_cr(world, cr, CrPart::Response, &patch).await?;
                tracing::info!(%response, "client response written");
                Ok(Outcome {
                    progressed: true,
                    ..Outcome::default()
                })
            }
        }
    }

    /// Merge-patches `part` of `cr`; what the hub answers stands in for the cached CR until the
    /// watch brings it, so the next pass does not decide on the version before.
    async fn patch_cr(
        &self,
        world: &World,
        cr: &WorkerSliceGwRecycler,
        part: CrPart,
        patch: &serde_json::Value,
    ) -> Result<(), ReconcileError> {
        let api = LeanApi::new(Api::<WorkerSliceGwRecycler>::namespaced(
            self.hub.clone(),
            &self.hub_namespace,
        ));
        let (name, params, patch) = (
            cr.name_any(),
            write_params(&self.manager),
            Patch::Merge(patch),
        );
        let write = async {
            match part {
                CrPart::State | CrPart::FailureReported => api.patch(&name, &params, &patch).await,
                CrPart::Condition | CrPart::Response => {
                    api.patch_status(&name, &params, &patch).await
                }
            }
        };
        let written = world.recyclers.write(cr, write).await;
        written.map(drop).map_err(|source| {
            let recycler = name;
            match part {
                CrPart::State => ReconcileError::WriteState { recycler, source },
                CrPart::Condition | CrPart::FailureReported => {
                    ReconcileError::WriteCondition { recycler, source }
                }
                CrPart::Response => ReconcileError::WriteResponse { recycler, source },
            }
        })
    }

    async fn announce(
        &self,
        cr: &WorkerSliceGwRecycler,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference: ObjectReference = cr.object_ref(&());
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Recycle".into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, reason, "event not published");
        }
    }
}

/// One deployment's facts, from the caches: and (when `read_nsm_ip`) its pod's NSM IP as
/// `gateway` publishes it (see [`published_nsm_ip`]).
fn deployment_facts(
    world: &World,
    gateway: Option<&SliceGateway>,
    name: &str,
    intermediate: &[String],
    read_nsm_ip: bool,
) -> DeploymentFacts {
    let deployment = world.deployment(name);
    let pod = world
        .deployment_pods(name)
        .into_iter()
        .next()
        .map(|p| PodFacts {
            excluded: is_excluded(&p),
            nsm_ip: if read_nsm_ip {
                published_nsm_ip(&p, gateway)
            } else {
                None
            },
        });
    DeploymentFacts {
        present: deployment.is_some(),
        intermediate: intermediate.iter().any(|d| d == name),
        marked_for_deletion: deployment.as_deref().is_some_and(is_marked_for_deletion),
        pod,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recycler(state: &str, annotation: Option<&str>, reported: bool) -> WorkerSliceGwRecycler {
        let mut cr: WorkerSliceGwRecycler = serde_json::from_value(json!({
            "apiVersion": "worker.kubeslice.io/v1alpha1", "kind": "WorkerSliceGwRecycler",
            "metadata": {"name": "red-a-b-0-0", "namespace": "kubeslice-red"},
            "spec": {"state": state}
        }))
        .expect("recycler");
        if let Some(message) = annotation {
            cr.annotations_mut()
                .insert(ANNOTATION_FAILURE.into(), message.into());
        }
        if reported {
            cr.annotations_mut().insert(
                ANNOTATION_FAILURE_REPORTED.into(),
                "2026-01-01T00:00:00Z".into(),
            );
        }
        cr
    }

    const WHY: &str = "step new_deployment_created_state timed out after 2s waiting for: the client responds new_deployment_created";

    #[test]
    fn an_error_state_not_announced_yet_is_announced_from_the_annotation() {
        let cr = recycler("error_state", Some(WHY), false);
        assert_eq!(unrecorded_failure(&cr), Some(WHY));
    }

    /// On kubeslice-controller's CRD the hub prunes `status.conditions`: a CR whose condition is
    /// gone but whose failure was announced needs nothing (it used to be announced every pass).
    #[test]
    fn an_announced_failure_needs_nothing_without_its_pruned_condition() {
        let cr = recycler("error_state", Some(WHY), true);
        assert!(
            cr.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_none()
        );
        assert_eq!(unrecorded_failure(&cr), None);
    }

    #[test]
    fn a_recorded_failure_or_another_state_needs_nothing() {
        assert_eq!(
            unrecorded_failure(&recycler("error_state", Some(WHY), true)),
            None
        );
        assert_eq!(
            unrecorded_failure(&recycler("new_deployment_created_state", Some(WHY), false)),
            None
        );
        // A CR put in error_state by someone else: no reason known, nothing invented.
        assert_eq!(
            unrecorded_failure(&recycler("error_state", None, false)),
            None
        );
    }
}
