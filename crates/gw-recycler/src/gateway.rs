//! The slice gateway reconciler: per SliceGateway, one Deployment per gateway instance plus every
//! intermediate deployment a recycle asked for, marked deployments deleted (never an instance's
//! only one), `status.gatewayPodStatus` from each Running gateway pod's sidecar, and the slice
//! router's next hops pushed from that status.
//!
//! Facts of KubeSlice's worker-operator this follows (`ReconcileGwPodStatus`): each Running
//! gateway pod's sidecar is asked `GetStatus`, then `GetSliceGwRemotePodName` with the
//! SliceGateway's `status.config.sliceGatewayRemoteVpnIp`; the gateway sidecar dials that VPN IP
//! (port 5000) through its own tunnel and returns the remote sidecar's `GetStatus`, whose
//! `gatewayPodName` is published as the pod's `peerPodName` (empty when the call fails). Its
//! recycler reads a deployment's NSM IPs from `gatewayPodStatus`, and its rebalancing names the
//! client deployment from `peerPodName`. **Decisions**: the peer is asked once per tunnel (while
//! the tunnel stays UP to the same remote IP the last name stands) and the last known name stands
//! when the sidecar does not answer; a pod without `peerPodName` still gets router traffic (see
//! `gw_recycler_core::nexthop`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use capstan_apis::networking::{GwPodInfo, SliceGateway, TunnelState, TunnelStatus};
use capstan_runtime::kube_errors::{is_conflict, is_not_found};
use capstan_runtime::sync::lock;
use gw_recycler_core::naming::{deployment_name, instance_of};
use gw_recycler_core::nexthop::{GatewayPodFacts, NextHops, next_hops};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;

use crate::error::ReconcileError;
use crate::ops::write_params;
use crate::sidecars::Sidecars;
use crate::template::GatewayTemplate;
use crate::world::{
    World, incarnation, is_excluded, is_marked_for_deletion, label, pod_ip, remote_subnet, slice_of,
};
use capstan_apis::networking::LABEL_SLICEGW;
use capstan_proto::sidecar::GwPodStatus;
use capstan_runtime::lean::LeanApi;

/// How long a gateway sidecar's complete answer (an NSM IP and an UP tunnel) stands for its pod
/// incarnation. Every watch event of a gateway's pods, deployments or SliceGateway starts a pass,
/// and each pass asked every pod's sidecar again, though a healthy sidecar's answer does not
/// change. An incomplete answer is never reused, so a sidecar coming up is still probed on every
/// pass; a tunnel that goes DOWN is published by the first pass after this long.
pub const STATUS_TTL: Duration = Duration::from_secs(1);

/// Settings and memory of the reconciler.
pub struct GatewayReconciler {
    pub client: kube::Client,
    pub namespace: String,
    pub instances: u32,
    pub template: GatewayTemplate,
    pub sidecars: Sidecars,
    pub manager: String,
    /// How often a gateway with running pods is passed over with no event: nothing announces a
    /// tunnel going DOWN (or UP again) but the sidecar's answer.
    pub status_interval: Duration,
    /// Per gateway, the router incarnation last pushed to and the next hops it got: pushed again
    /// when they change, to a new router pod or a restarted router container, or after a failed
    /// push. One entry per gateway, so routers coming and going leave nothing behind.
    pushed: Mutex<HashMap<String, Pushed>>,
    /// Per gateway, the sidecar answers of its pods (see [`STATUS_TTL`]), and the last complete
    /// one per pod incarnation, which stands while its sidecar does not answer.
    answers: Mutex<HashMap<String, Answers>>,
}

/// A gateway sidecar's answer, and for which pod incarnation at which IP, asked when.
#[derive(Debug, Clone)]
struct Answer {
    incarnation: String,
    ip: String,
    at: Instant,
    status: GwPodStatus,
    /// The peer pod its sidecar named (`GetSliceGwRemotePodName`), asked only of a complete
    /// answer (a tunnel UP) when the SliceGateway has a remote VPN IP.
    peer: Option<String>,
}

/// One gateway's sidecar answers: the complete ones by pod name, and since when each pod
/// incarnation whose sidecar does not answer completely has been so.
#[derive(Debug, Default)]
struct Answers {
    complete: HashMap<String, Answer>,
    incomplete_since: HashMap<String, (String, Instant)>,
}

impl Answers {
    /// The answer that still stands for `pod` as it is now: the same incarnation at the same IP,
    /// asked less than [`STATUS_TTL`] ago.
    fn standing(&self, pod: &str, incarnation: &str, ip: &str, now: Instant) -> Option<&Answer> {
        self.last_good(pod, incarnation, ip)
            .filter(|a| now.duration_since(a.at) < STATUS_TTL)
    }

    /// The last complete answer of `pod` as it is now (the same incarnation at the same IP), however
    /// old: what stands when its sidecar does not answer. A restarted container, a new IP or an
    /// answer since that was not complete (a tunnel DOWN) ends it.
    fn last_good(&self, pod: &str, incarnation: &str, ip: &str) -> Option<&Answer> {
        self.complete
            .get(pod)
            .filter(|a| a.incarnation == incarnation && a.ip == ip)
    }

    /// Keeps `answer` for `pod` when it is [`complete`]; an incomplete one is asked again on the
    /// next pass.
    fn keep(&mut self, pod: &str, answer: Answer) {
        if complete(&answer.status) {
            self.complete.insert(pod.to_owned(), answer);
        }
    }

    /// Records that `pod`'s sidecar, in `incarnation`, did not answer completely at `now`; how
    /// long it has not, carried over from the last pass's `known` answers while the incarnation
    /// is the same.
    fn incomplete(
        &mut self,
        known: &Answers,
        pod: &str,
        incarnation: &str,
        now: Instant,
    ) -> Duration {
        let since = known
            .incomplete_since
            .get(pod)
            .filter(|(seen, _)| seen == incarnation)
            .map_or(now, |&(_, since)| since);
        self.incomplete_since
            .insert(pod.to_owned(), (incarnation.to_owned(), since));
        now.saturating_duration_since(since)
    }

    fn is_empty(&self) -> bool {
        self.complete.is_empty() && self.incomplete_since.is_empty()
    }
}

/// Whether a sidecar's answer says all the reconciler waits for: an NSM IP and an UP tunnel.
fn complete(status: &GwPodStatus) -> bool {
    let nsm_ip = status.nsm_intf_status.as_ref().map(|n| n.nsm_ip.as_str());
    !nsm_ip.unwrap_or_default().is_empty() && tunnel_state(status) == TunnelState::Up
}

/// The tunnel state a sidecar reports. No `tunnelStatus` at all is DOWN: KubeSlice's sidecar
/// omits it until its first tunnel check, so the proto default (0 = UP) would route traffic into a
/// tunnel nobody has seen up.
fn tunnel_state(status: &GwPodStatus) -> TunnelState {
    status
        .tunnel_status
        .as_ref()
        .map_or(TunnelState::Down, |t| TunnelState::from(t.status))
}

/// The IP the tunnel reaches on the far side, as the sidecar reports it.
fn tunnel_remote(status: &GwPodStatus) -> Option<&str> {
    status.tunnel_status.as_ref().map(|t| t.peer_ip.as_str())
}

/// The `gatewayPodStatus` entry of pod `name` at `ip` whose sidecar answered `answer`.
fn published(name: Option<String>, ip: String, answer: &Answer) -> GwPodInfo {
    let status = &answer.status;
    let nsm_ip = status.nsm_intf_status.as_ref().map(|n| n.nsm_ip.clone());
    let tunnel = status.tunnel_status.clone().unwrap_or_default();
    GwPodInfo {
        pod_name: name,
        pod_ip: Some(ip),
        local_nsm_ip: Some(nsm_ip.unwrap_or_default()),
        tunnel_status: Some(TunnelStatus {
            intf_name: Some(tunnel.net_interface),
            local_ip: Some(tunnel.local_ip),
            remote_ip: Some(tunnel.peer_ip),
            status: Some(tunnel_state(status)),
            ..TunnelStatus::default()
        }),
        peer_pod_name: answer.peer.clone(),
        ..GwPodInfo::default()
    }
}

/// The gateway's Running pods as its sidecars (or what stands for them) describe them.
#[derive(Debug, Default)]
struct PodStatus {
    /// The `gatewayPodStatus` entries.
    infos: Vec<GwPodInfo>,
    /// A sidecar not ready yet, for less than the status interval (see [`Pass::unready`]).
    unready: bool,
    /// Pods whose sidecar did not answer with nothing known of their incarnation.
    unanswered: BTreeSet<String>,
}

/// The next hops last pushed for one gateway, and to which router incarnation.
#[derive(Debug, PartialEq, Eq)]
struct Pushed {
    router: String,
    hops: Vec<String>,
}

/// What a pass left undone.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// A gateway pod's sidecar is not ready yet, and has not been for less than the status
    /// interval (a pod coming up): re-check after a short backoff. One unready for longer (a
    /// tunnel that stays DOWN, a sidecar that stays away) is asked every status interval.
    pub unready: bool,
    /// Pass again after this long though nothing changes (the gateway has running pods, whose
    /// tunnels only their sidecars report).
    pub recheck_after: Option<Duration>,
}

impl GatewayReconciler {
    pub fn new(
        client: kube::Client,
        namespace: String,
        instances: u32,
        template: GatewayTemplate,
        sidecars: Sidecars,
        manager: String,
        status_interval: Duration,
    ) -> Self {
        Self {
            client,
            namespace,
            instances,
            template,
            sidecars,
            manager,
            status_interval,
            pushed: Mutex::default(),
            answers: Mutex::default(),
        }
    }

    /// One pass over `gateway`. The router's next hops go out before `gatewayPodStatus` is
    /// written: the router is the data path, the status only records what the sidecars reported.
    /// No watch event announces a route, so `on_changed` tells the recycles, which read both, once
    /// the push and the status write (when either changed) are out.
    #[tracing::instrument(skip(self, world, gateway, on_changed), fields(gateway = gateway.metadata.name.as_deref().unwrap_or_default()))]
    pub async fn reconcile(
        &self,
        world: &World,
        gateway: &SliceGateway,
        on_changed: impl FnOnce(),
    ) -> Result<Pass, ReconcileError> {
        let name = gateway.metadata.name.clone().unwrap_or_default();
        let Some(slice) = slice_of(gateway) else {
            return Ok(Pass::default());
        };
        let evicted = self.sidecars.keep_only(&world.pod_ips());
        if evicted > 0 {
            tracing::debug!(evicted, "dropped the sidecar channels of pods gone");
        }
        // Deployments: ensure, then remove the marked ones.
        self.ensure_deployments(world, gateway, &name, &slice)
            .await?;
        // Pod status from the sidecars.
        let PodStatus {
            infos,
            unready,
            unanswered,
        } = self.pod_status(world, gateway, &name).await;
        let pushed = self
            .push_next_hops(world, gateway, &name, &slice, &infos, &unanswered)
            .await;
        let published = gateway.gateway_pods() != infos.as_slice();
        if published {
            let api = LeanApi::new(Api::<SliceGateway>::namespaced(
                self.client.clone(),
                &self.namespace,
            ));
            let patch = json!({"status": {"gatewayPodStatus": infos}});
            let params = write_params(&self.manager);
            let patch = Patch::Merge(&patch);
            let write = api.patch_status(&name, &params, &patch);
            world
                .gateways
                .write(gateway, write)
                .await
                .map_err(|source| ReconcileError::WriteGatewayPodStatus {
                    gateway: name.clone(),
                    source,
                })?;
        }
        // The recycles read the NSM IPs published here too: told once both are out.
        if published || matches!(pushed, Ok(true)) {
            on_changed();
        }
        pushed?;
        Ok(Pass {
            unready,
            recheck_after: (!infos.is_empty()).then_some(self.status_interval),
        })
    }

    /// Pushes the next hops `infos` and the pods' labels select to the slice router, when they
    /// differ from what it last got; whether they went out. None go out when the sidecars of
    /// `unanswered` pods leave nothing known to carry traffic (see [`NextHops::Keep`]).
    async fn push_next_hops(
        &self,
        world: &World,
        gateway: &SliceGateway,
        name: &str,
        slice: &str,
        infos: &[GwPodInfo],
        unanswered: &BTreeSet<String>,
    ) -> Result<bool, ReconcileError> {
        let facts: Vec<GatewayPodFacts> = world
            .gateway_pods(name)
            .iter()
            .map(|pod| {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                let info = infos
                    .iter()
                    .find(|i| i.pod_name.as_deref() == Some(&pod_name));
                GatewayPodFacts {
                    excluded: is_excluded(pod),
                    nsm_ip: info.and_then(|i| i.nsm_ip()).unwrap_or_default().to_owned(),
                    tunnel_up: info.is_some_and(|i| i.tunnel_up()),
                    unanswered: unanswered.contains(&pod_name),
                    pod_name,
                }
            })
            .collect();
        let hops = match next_hops(&facts) {
            NextHops::Push(hops) => hops,
            NextHops::Keep { unanswered } => {
                return Err(ReconcileError::SidecarsSilent {
                    gateway: name.to_owned(),
                    pods: unanswered,
                });
            }
        };
        let (Some((router_incarnation, router)), Some(subnet)) =
            (world.router(slice), remote_subnet(gateway))
        else {
            return Ok(false);
        };
        let pushed = Pushed {
            router: router_incarnation,
            hops,
        };
        if lock(&self.pushed).get(name) == Some(&pushed) {
            return Ok(false);
        }
        if let Err(error) = self
            .sidecars
            .set_next_hops(&router, &subnet, &pushed.hops)
            .await
        {
            // Unknown what the router holds now: push again on the next pass.
            lock(&self.pushed).remove(name);
            return Err(ReconcileError::PushNextHops {
                gateway: name.to_owned(),
                router,
                source: error,
            });
        }
        tracing::info!(hops = ?pushed.hops, %router, "router next hops pushed");
        lock(&self.pushed).insert(name.to_owned(), pushed);
        Ok(true)
    }

    async fn ensure_deployments(
        &self,
        world: &World,
        gateway: &SliceGateway,
        name: &str,
        slice: &str,
    ) -> Result<(), ReconcileError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace);
        let existing: Vec<_> = world
            .deployments
            .state()
            .into_iter()
            .filter(|d| label(d.as_ref(), LABEL_SLICEGW) == Some(name))
            .collect();
        let existing_names: BTreeSet<String> = existing
            .iter()
            .filter_map(|d| d.metadata.name.clone())
            .collect();
        let intermediate = gateway.intermediate_deployments();
        let mut wanted: Vec<String> = intermediate
            .iter()
            .filter(|d| !existing_names.contains(*d))
            .cloned()
            .collect();
        for instance in 0..self.instances {
            let covered = existing_names
                .iter()
                .chain(intermediate)
                .any(|d| instance_of(name, d) == Some(instance));
            if !covered {
                wanted.push(deployment_name(name, instance, 0));
            }
        }
        for dep in wanted {
            let deployment = self.template.deployment(&self.namespace, name, slice, &dep);
            // Through the store, so the next pass sees the deployment before its watch event
            // does and does not create it again (a 409 under load, before this went through it).
            let params = PostParams::default();
            let create = api.create(&params, &deployment);
            match world.deployments.write(&deployment, create).await {
                Ok(_) => tracing::info!(deployment = %dep, "gateway deployment created"),
                Err(e) if is_conflict(&e) => {}
                Err(source) => {
                    return Err(ReconcileError::CreateDeployment {
                        deployment: dep,
                        source,
                    });
                }
            }
        }
        // Per instance, the deployments that stay; a marked one goes only when another does.
        let mut staying: BTreeMap<u32, usize> = BTreeMap::new();
        for d in &existing {
            if let Some(i) = d
                .metadata
                .name
                .as_deref()
                .and_then(|n| instance_of(name, n))
                && !is_marked_for_deletion(d)
            {
                *staying.entry(i).or_default() += 1;
            }
        }
        for d in existing.iter().filter(|d| is_marked_for_deletion(d)) {
            let dep = d.metadata.name.clone().unwrap_or_default();
            let instance = instance_of(name, &dep);
            let replaced = instance.is_some_and(|i| staying.get(&i).copied().unwrap_or(0) > 0);
            if !replaced || d.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let params = DeleteParams::background();
            let delete = LeanApi::new(api.clone());
            match world
                .deployments
                .delete(d, delete.delete(&dep, &params))
                .await
            {
                Ok(_) => tracing::info!(deployment = %dep, "marked gateway deployment deleted"),
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(ReconcileError::DeleteDeployment {
                        deployment: dep,
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    /// `gatewayPodStatus` entries of the Running gateway pods, and whether any is not ready yet.
    /// The sidecars not answered completely within [`STATUS_TTL`] are asked at once: a pass costs
    /// at most one gRPC round trip, not one per pod. A sidecar that does not answer leaves its
    /// pod as it was last known: its last complete answer in this incarnation, else the entry
    /// `gateway` publishes for the pod at that IP (what survives a restart of this process).
    async fn pod_status(&self, world: &World, gateway: &SliceGateway, name: &str) -> PodStatus {
        let now = Instant::now();
        let pods: Vec<(Option<String>, String, String)> = world
            .gateway_pods(name)
            .iter()
            .filter_map(|pod| Some((pod.metadata.name.clone(), pod_ip(pod)?, incarnation(pod))))
            .collect();
        let known = lock(&self.answers).remove(name).unwrap_or_default();
        let remote_vpn_ip = gateway
            .config()
            .and_then(|c| c.slice_gateway_remote_vpn_ip.as_deref())
            .filter(|ip| !ip.is_empty());
        let known_ref = &known;
        let replies = futures::future::join_all(pods.iter().map(|(pod, ip, incarnation)| {
            let pod = pod.as_deref();
            async move {
                if let Some(answer) =
                    pod.and_then(|pod| known_ref.standing(pod, incarnation, ip, now))
                {
                    return Ok(answer.clone());
                }
                let peer = KnownPeer {
                    last: pod
                        .and_then(|pod| known_ref.last_good(pod, incarnation, ip))
                        .cloned(),
                    published: pod
                        .and_then(|pod| gateway.published_pod(pod, ip))
                        .and_then(|info| info.peer_pod_name.clone())
                        .filter(|peer| !peer.is_empty()),
                };
                self.ask(ip, incarnation, remote_vpn_ip, peer).await
            }
        }))
        .await;
        let mut answers = Answers::default();
        let mut status = PodStatus {
            infos: Vec::with_capacity(pods.len()),
            ..PodStatus::default()
        };
        // Whether a pod's sidecar, not answering completely now, is worth a short backoff.
        let waiting = |answers: &mut Answers, name: Option<&str>, incarnation: &str| {
            name.is_none_or(|name| {
                answers.incomplete(&known, name, incarnation, now) < self.status_interval
            })
        };
        for ((pod, ip, incarnation), reply) in pods.into_iter().zip(replies) {
            let answer = match reply {
                Ok(answer) => answer,
                Err(error) => {
                    status.unready |= waiting(&mut answers, pod.as_deref(), &incarnation);
                    let last = pod
                        .as_deref()
                        .and_then(|pod| known.last_good(pod, &incarnation, &ip));
                    if let (Some(pod), Some(last)) = (&pod, last) {
                        tracing::debug!(%error, pod, "gateway sidecar not answering: its last answer stands");
                        answers.keep(pod, last.clone());
                        status.infos.push(published(Some(pod.clone()), ip, last));
                        continue;
                    }
                    let was = pod
                        .as_deref()
                        .and_then(|pod| gateway.published_pod(pod, &ip));
                    if let Some(was) = was {
                        tracing::debug!(%error, ?pod, "gateway sidecar not answering: its published status stands");
                        status.infos.push(was.clone());
                        continue;
                    }
                    tracing::debug!(%error, ?pod, "gateway sidecar not answering, nothing known");
                    status.unanswered.extend(pod.clone());
                    status.infos.push(GwPodInfo {
                        pod_name: pod,
                        pod_ip: Some(ip),
                        ..GwPodInfo::default()
                    });
                    continue;
                }
            };
            if !complete(&answer.status) {
                status.unready |= waiting(&mut answers, pod.as_deref(), &incarnation);
            }
            status.infos.push(published(pod.clone(), ip, &answer));
            if let Some(pod) = &pod {
                answers.keep(pod, answer);
            }
        }
        if !answers.is_empty() {
            lock(&self.answers).insert(name.to_owned(), answers);
        }
        status
    }

    /// Asks the sidecar of the pod at `ip` for its status and, when its tunnel is UP and the
    /// SliceGateway has a remote VPN IP, for its peer (see [`Self::peer`]).
    async fn ask(
        &self,
        ip: &str,
        incarnation: &str,
        remote_vpn_ip: Option<&str>,
        known: KnownPeer,
    ) -> Result<Answer, crate::sidecars::SidecarError> {
        let status = self.sidecars.gateway_status(ip).await?;
        let peer = match remote_vpn_ip {
            Some(vpn_ip) if complete(&status) => self.peer(ip, vpn_ip, &status, known).await,
            _ => None,
        };
        Ok(Answer {
            incarnation: incarnation.to_owned(),
            ip: ip.to_owned(),
            at: Instant::now(),
            status,
            peer,
        })
    }

    /// The peer pod of the pod at `ip`, whose sidecar just answered `status` with its tunnel UP.
    /// A tunnel that stayed UP to the same remote IP in the same incarnation keeps its peer (one
    /// that reconnects elsewhere goes DOWN first, which ends the last answer), so the sidecar is
    /// asked once per tunnel, not on every probe. When it does not name one, the last known
    /// stands (the reference publishes an empty name then).
    async fn peer(
        &self,
        ip: &str,
        remote_vpn_ip: &str,
        status: &GwPodStatus,
        known: KnownPeer,
    ) -> Option<String> {
        if let Some(peer) = known.standing(status) {
            return Some(peer);
        }
        let fallback = || known.last_known();
        match self.sidecars.peer_pod_name(ip, remote_vpn_ip).await {
            Ok(name) if !name.is_empty() => Some(name),
            Ok(_) => fallback(),
            Err(error) => {
                tracing::debug!(%error, pod_ip = ip, "gateway sidecar did not name its peer: the last known stands");
                fallback()
            }
        }
    }
}

/// What is known of a pod's peer before its sidecar is asked: its last complete answer in this
/// incarnation, and the `peerPodName` the SliceGateway publishes for it.
struct KnownPeer {
    last: Option<Answer>,
    published: Option<String>,
}

impl KnownPeer {
    /// The peer that stands without asking, for a sidecar that now answers `status`: the last
    /// answer's, while its tunnel reaches the same remote IP (the last answer is of this
    /// incarnation and was complete, so the tunnel has not been DOWN since).
    fn standing(&self, status: &GwPodStatus) -> Option<String> {
        let last = self.last.as_ref()?;
        (tunnel_remote(&last.status) == tunnel_remote(status))
            .then(|| last.peer.clone())
            .flatten()
    }

    /// What stands when the sidecar does not name a peer: the last one it named in this
    /// incarnation, else the published one.
    fn last_known(&self) -> Option<String> {
        self.last
            .as_ref()
            .and_then(|a| a.peer.clone())
            .or_else(|| self.published.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_proto::sidecar::{NsmInterfaceStatus, TunnelInterfaceStatus};

    fn answer(nsm_ip: &str, tunnel: TunnelState, at: Instant) -> Answer {
        Answer {
            incarnation: "uid-1/0".into(),
            ip: "127.10.0.4".into(),
            at,
            peer: None,
            status: GwPodStatus {
                nsm_intf_status: Some(NsmInterfaceStatus {
                    nsm_ip: nsm_ip.into(),
                    ..NsmInterfaceStatus::default()
                }),
                tunnel_status: Some(TunnelInterfaceStatus {
                    status: tunnel.code(),
                    ..TunnelInterfaceStatus::default()
                }),
                ..GwPodStatus::default()
            },
        }
    }

    #[test]
    fn a_complete_answer_stands_for_its_pod_incarnation_and_ip_until_the_ttl() {
        let asked = Instant::now();
        let mut answers = Answers::default();
        answers.keep("gw-0", answer("10.1.1.1", TunnelState::Up, asked));
        let soon = asked + STATUS_TTL / 2;
        let late = asked + STATUS_TTL;
        // The same pod, incarnation and IP within the TTL stands; another pod, a restarted
        // container, a new IP, or the TTL over: ask again.
        let cases = [
            ("gw-0", "uid-1/0", "127.10.0.4", soon, true),
            ("gw-1", "uid-1/0", "127.10.0.4", soon, false),
            ("gw-0", "uid-1/1", "127.10.0.4", soon, false),
            ("gw-0", "uid-1/0", "127.10.0.5", soon, false),
            ("gw-0", "uid-1/0", "127.10.0.4", late, false),
        ];
        for (pod, incarnation, ip, at, stands) in cases {
            assert_eq!(
                answers.standing(pod, incarnation, ip, at).is_some(),
                stands,
                "{pod} {incarnation} {ip}"
            );
        }
    }

    #[test]
    fn the_last_complete_answer_stands_for_its_incarnation_however_old() {
        let asked = Instant::now();
        let mut answers = Answers::default();
        answers.keep("gw-0", answer("10.1.1.1", TunnelState::Up, asked));
        let much_later = asked + STATUS_TTL * 100;
        assert!(
            answers
                .standing("gw-0", "uid-1/0", "127.10.0.4", much_later)
                .is_none()
        );
        let last = answers.last_good("gw-0", "uid-1/0", "127.10.0.4");
        assert_eq!(
            last.and_then(|a| a.status.nsm_intf_status.as_ref())
                .map(|n| n.nsm_ip.as_str()),
            Some("10.1.1.1")
        );
        // Not for a restarted container or a new IP.
        assert!(answers.last_good("gw-0", "uid-1/1", "127.10.0.4").is_none());
        assert!(answers.last_good("gw-0", "uid-1/0", "127.10.0.5").is_none());
    }

    #[test]
    fn an_incomplete_answer_is_never_kept() {
        let now = Instant::now();
        let mut answers = Answers::default();
        answers.keep("no-nsm-ip", answer("", TunnelState::Up, now));
        answers.keep("tunnel-down", answer("10.1.1.1", TunnelState::Down, now));
        assert!(answers.complete.is_empty(), "{answers:?}");
    }

    #[test]
    fn an_incomplete_sidecar_is_timed_from_its_incarnations_first_incomplete_answer() {
        let first = Instant::now();
        let later = first + Duration::from_secs(3);
        let mut known = Answers::default();
        assert_eq!(
            known.incomplete(&Answers::default(), "gw-0", "uid-1/0", first),
            Duration::ZERO
        );
        // The next pass carries the wait over for the same incarnation ...
        let mut next = Answers::default();
        assert_eq!(
            next.incomplete(&known, "gw-0", "uid-1/0", later),
            Duration::from_secs(3)
        );
        // ... a restarted container, or another pod, waits from now ...
        assert_eq!(
            next.incomplete(&known, "gw-0", "uid-1/1", later),
            Duration::ZERO
        );
        assert_eq!(
            next.incomplete(&known, "gw-1", "uid-2/0", later),
            Duration::ZERO
        );
        // ... and a pass with a complete answer in between forgets the wait.
        known = Answers::default();
        known.keep("gw-0", answer("10.1.1.1", TunnelState::Up, later));
        let mut after = Answers::default();
        assert_eq!(
            after.incomplete(&known, "gw-0", "uid-1/0", later),
            Duration::ZERO
        );
    }

    #[test]
    fn a_peer_stands_while_the_tunnel_reaches_the_same_remote_ip() {
        let now = Instant::now();
        let with_remote = |remote: &str| {
            let mut a = answer("10.1.1.1", TunnelState::Up, now);
            if let Some(t) = a.status.tunnel_status.as_mut() {
                t.peer_ip = remote.into();
            }
            a
        };
        let mut last = with_remote("10.0.0.2");
        last.peer = Some("red-b-a-1-0-abc-xyz".into());
        let known = KnownPeer {
            last: Some(last),
            published: Some("red-b-a-0-0-old-pod".into()),
        };
        assert_eq!(
            known.standing(&with_remote("10.0.0.2").status).as_deref(),
            Some("red-b-a-1-0-abc-xyz")
        );
        // The tunnel reaches elsewhere now: asked again.
        assert_eq!(known.standing(&with_remote("10.0.0.9").status), None);
        // Not answered: the last named stands, else the published one.
        assert_eq!(known.last_known().as_deref(), Some("red-b-a-1-0-abc-xyz"));
        let unnamed = KnownPeer {
            last: Some(with_remote("10.0.0.2")),
            published: Some("red-b-a-0-0-old-pod".into()),
        };
        assert_eq!(unnamed.standing(&with_remote("10.0.0.2").status), None);
        assert_eq!(unnamed.last_known().as_deref(), Some("red-b-a-0-0-old-pod"));
        let nothing = KnownPeer {
            last: None,
            published: None,
        };
        assert_eq!(nothing.standing(&with_remote("10.0.0.2").status), None);
        assert_eq!(nothing.last_known(), None);
    }

    #[test]
    fn an_answer_is_complete_as_gateway_pod_status_would_publish_it() {
        let now = Instant::now();
        assert!(complete(&answer("10.1.1.1", TunnelState::Up, now).status));
        // No tunnel status at all (KubeSlice's sidecar before its first check) is DOWN, and
        // published so.
        let mut no_tunnel = answer("10.1.1.1", TunnelState::Up, now);
        no_tunnel.status.tunnel_status = None;
        assert!(!complete(&no_tunnel.status));
        let info = published(Some("gw-0".into()), "127.10.0.4".into(), &no_tunnel);
        assert!(!info.tunnel_up(), "{info:?}");
        assert_eq!(info.nsm_ip(), Some("10.1.1.1"));
        assert_eq!(info.peer_pod_name, None);
        // The peer its sidecar named is published with it.
        let mut paired = answer("10.1.1.1", TunnelState::Up, now);
        paired.peer = Some("red-b-a-1-0-7d9f-x2k4q".into());
        let info = published(Some("gw-0".into()), "127.10.0.4".into(), &paired);
        assert_eq!(
            info.peer_pod_name.as_deref(),
            Some("red-b-a-1-0-7d9f-x2k4q")
        );
        let mut no_nsm = answer("10.1.1.1", TunnelState::Up, now).status;
        no_nsm.nsm_intf_status = None;
        assert!(!complete(&no_nsm));
    }
}
