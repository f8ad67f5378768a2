//! `gw-recycler trigger`: creates a WorkerSliceGwRecycler on the hub with the reference's name and
//! labels (at most one recycle per SliceGateway at a time) and, with `--wait`, follows it to
//! `end` or `error_state`, printing each state change.
//!
//! The check is atomic where it matters: the CR is named after the gateway instance's current
//! server deployment, so two triggers racing for the same instance create the same name and the
//! second gets 409 (reported as the recycle in progress); a finished recycle of that name is
//! deleted only with its uid and resourceVersion as preconditions, so a racing trigger never
//! deletes the recycle another one just created. A failed recycle of either gateway blocks a new
//! one until someone has looked at it and deleted it.

use std::path::PathBuf;

use capstan_apis::worker::{
    GwPair, LABEL_SLICE_NAME, LABEL_SLICEGW_NAME, WorkerSliceGwRecycler, WorkerSliceGwRecyclerSpec,
};
use futures::StreamExt;
use gw_recycler_core::State;
use gw_recycler_core::naming::{deployment_name, next_deployment_name};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};

use crate::recycler::state_since;

/// Start a recycle of one gateway pair.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct TriggerArgs {
    /// Kubeconfig of the hub cluster.
    #[arg(long, env = "HUB_KUBECONFIG")]
    pub hub_kubeconfig: PathBuf,
    /// Project namespace on the hub.
    #[arg(long, env = "HUB_NAMESPACE")]
    pub hub_namespace: String,
    /// Slice name.
    #[arg(long)]
    pub slice: String,
    /// The server-side SliceGateway.
    #[arg(long)]
    pub server_gateway: String,
    /// The client-side SliceGateway.
    #[arg(long)]
    pub client_gateway: String,
    /// Gateway instance to recycle.
    #[arg(long, default_value_t = 0)]
    pub instance: u32,
    /// The current server deployment (default: the successor of the one the newest finished
    /// recycle of this instance on the hub replaced, else `<server-gateway>-<instance>-0`. Once
    /// finished recycles are gone after their retention, name it: a recycle naming a deployment
    /// that no longer exists waits in `init` and then fails saying so).
    #[arg(long)]
    pub server_deployment: Option<String>,
    /// The current client deployment (default: as for the server, the client the newest finished
    /// recycle created, else `<client-gateway>-<instance>-0`).
    #[arg(long)]
    pub client_deployment: Option<String>,
    /// Follow the recycle to `end` or `error_state` (exit 1 on error).
    #[arg(long)]
    pub wait: bool,
}

impl TriggerArgs {
    /// A recycle of instance 0 of the pair, not followed (`--wait` off).
    pub fn new(
        hub_kubeconfig: impl Into<PathBuf>,
        hub_namespace: &str,
        slice: &str,
        server_gateway: &str,
        client_gateway: &str,
    ) -> Self {
        Self {
            hub_kubeconfig: hub_kubeconfig.into(),
            hub_namespace: hub_namespace.to_owned(),
            slice: slice.to_owned(),
            server_gateway: server_gateway.to_owned(),
            client_gateway: client_gateway.to_owned(),
            instance: 0,
            server_deployment: None,
            client_deployment: None,
            wait: false,
        }
    }

    /// The `gw-recycler` arguments (from `trigger` on) that parse back into these: what tests,
    /// the demo and its printed guide run.
    pub fn to_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "trigger",
            "--hub-kubeconfig",
            &self.hub_kubeconfig.to_string_lossy(),
            "--hub-namespace",
            &self.hub_namespace,
            "--slice",
            &self.slice,
            "--server-gateway",
            &self.server_gateway,
            "--client-gateway",
            &self.client_gateway,
        ]
        .map(str::to_owned)
        .into();
        if self.instance != 0 {
            args.extend(["--instance".to_owned(), self.instance.to_string()]);
        }
        for (flag, value) in [
            ("--server-deployment", &self.server_deployment),
            ("--client-deployment", &self.client_deployment),
        ] {
            if let Some(value) = value {
                args.extend([flag.to_owned(), value.clone()]);
            }
        }
        if self.wait {
            args.push("--wait".to_owned());
        }
        args
    }
}

/// Why a trigger did not start or finish a recycle.
#[derive(Debug, thiserror::Error)]
pub enum TriggerError {
    #[error("recycle {name} of SliceGateway {gateway} is in progress (state {state})")]
    InProgress {
        name: String,
        gateway: String,
        state: String,
    },
    #[error(
        "recycle {name} of SliceGateway {gateway} ended in error_state and needs attention \
         ({reason}): see `kubectl describe workerslicegwrecycler {name} -n {namespace}` and the \
         gateways' deployments, then delete it to recycle again"
    )]
    NeedsAttention {
        name: String,
        gateway: String,
        namespace: String,
        reason: String,
    },
    #[error("recycle {name} ended in error_state: {reason}")]
    Failed { name: String, reason: String },
    #[error("recycle {0} was deleted before it finished")]
    Vanished(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("hub kubeconfig: {0}")]
    Config(String),
}

impl TriggerError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            TriggerError::InProgress { .. } => "in_progress",
            TriggerError::NeedsAttention { .. } => "needs_attention",
            TriggerError::Failed { .. } => "failed",
            TriggerError::Vanished(_) => "vanished",
            TriggerError::Kube(_) => "kube",
            TriggerError::Config(_) => "config",
        }
    }
}

/// The deployments the instance's gateways run now, as far as the hub knows: the successors of
/// the pair the newest finished recycle of this instance replaced (each recycle flips the
/// generation), else generation 0. Finished recycles are kept for the server's `--retention`.
fn current_pair(existing: &[WorkerSliceGwRecycler], args: &TriggerArgs) -> (String, String) {
    let instance_prefix = format!("{}-{}", args.server_gateway, args.instance);
    let newest = existing
        .iter()
        .filter(|cr| cr.state() == State::End)
        .filter(|cr| cr.spec.slice_gw_server.as_deref() == Some(&args.server_gateway))
        .filter(|cr| cr.spec.slice_gw_client.as_deref() == Some(&args.client_gateway))
        .filter_map(|cr| {
            let pair = cr.spec.gw_pair.as_ref()?;
            let server = pair.server_id.as_deref()?;
            let client = pair.client_id.as_deref()?;
            (server.rsplit_once('-')?.0 == instance_prefix).then_some((cr, server, client))
        })
        .max_by_key(|(cr, ..)| state_since(cr));
    match newest {
        Some((cr, server, client)) => {
            let recycled_client = cr
                .status
                .as_ref()
                .and_then(|s| s.client.as_ref())
                .and_then(|c| c.recycled_client.clone())
                .filter(|c| !c.is_empty());
            (
                next_deployment_name(server),
                recycled_client.unwrap_or_else(|| next_deployment_name(client)),
            )
        }
        None => (
            deployment_name(&args.server_gateway, args.instance, 0),
            deployment_name(&args.client_gateway, args.instance, 0),
        ),
    }
}

/// The CR a trigger creates, given the recycles on the hub: the deployments named, else the
/// [current pair](current_pair).
pub fn recycler_for(
    args: &TriggerArgs,
    existing: &[WorkerSliceGwRecycler],
) -> WorkerSliceGwRecycler {
    let (current_server, current_client) = current_pair(existing, args);
    let server = args.server_deployment.clone().unwrap_or(current_server);
    let client = args.client_deployment.clone().unwrap_or(current_client);
    new_recycler(
        &args.hub_namespace,
        &args.slice,
        &args.server_gateway,
        &args.client_gateway,
        &server,
        &client,
    )
}

/// A recycle of the pair (`server`, `client`) of deployments, named after the server deployment
/// and labelled with the slice and the server SliceGateway, as the reference does; it starts in
/// `init` with request `none`.
pub fn new_recycler(
    hub_namespace: &str,
    slice: &str,
    server_gateway: &str,
    client_gateway: &str,
    server: &str,
    client: &str,
) -> WorkerSliceGwRecycler {
    let mut cr = WorkerSliceGwRecycler::new(
        server,
        WorkerSliceGwRecyclerSpec {
            slice_gw_server: Some(server_gateway.to_owned()),
            slice_gw_client: Some(client_gateway.to_owned()),
            gw_pair: Some(GwPair {
                server_id: Some(server.to_owned()),
                client_id: Some(client.to_owned()),
            }),
            state: Some(State::Init),
            request: Some(capstan_apis::worker::Request::None),
            slice_name: Some(slice.to_owned()),
        },
    );
    cr.metadata.namespace = Some(hub_namespace.to_owned());
    cr.metadata.labels = Some(
        [
            (LABEL_SLICE_NAME.to_owned(), slice.to_owned()),
            (LABEL_SLICEGW_NAME.to_owned(), server_gateway.to_owned()),
        ]
        .into(),
    );
    cr
}

/// The unfinished recycle involving either gateway (on either side), if any: the same rule as
/// rebalancing's (`World::recycle_in_progress`).
fn in_progress<'a>(
    existing: &'a [WorkerSliceGwRecycler],
    args: &TriggerArgs,
) -> Option<&'a WorkerSliceGwRecycler> {
    existing.iter().find(|cr| {
        cr.in_progress_for(&args.server_gateway) || cr.in_progress_for(&args.client_gateway)
    })
}

/// The failed recycle involving either gateway, if any: it may have left both generations of a
/// gateway running, and another recycle on top would hide what went wrong.
fn failed<'a>(
    existing: &'a [WorkerSliceGwRecycler],
    args: &TriggerArgs,
) -> Option<&'a WorkerSliceGwRecycler> {
    existing.iter().find(|cr| {
        cr.state() == State::Error
            && (cr.involves(&args.server_gateway) || cr.involves(&args.client_gateway))
    })
}

/// Why `cr` failed, from its condition or (where the hub's CRD prunes conditions) its
/// failure annotation.
fn failure_reason(cr: &WorkerSliceGwRecycler) -> String {
    cr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.last())
        .map(|c| c.message.clone())
        .or_else(|| {
            cr.annotations()
                .get(crate::recycler::ANNOTATION_FAILURE)
                .cloned()
        })
        .unwrap_or_else(|| "no reason recorded".to_owned())
}

pub async fn run(args: TriggerArgs) -> Result<(), TriggerError> {
    let client = crate::client_for(&args.hub_kubeconfig)
        .await
        .map_err(|e| TriggerError::Config(e.to_string()))?;
    let api: Api<WorkerSliceGwRecycler> = Api::namespaced(client, &args.hub_namespace);
    let existing = api.list(&Default::default()).await?.items;
    let gateway = args.server_gateway.clone();
    if let Some(cr) = in_progress(&existing, &args) {
        return Err(TriggerError::InProgress {
            name: cr.name_any(),
            gateway,
            state: cr.state().to_string(),
        });
    }
    if let Some(cr) = failed(&existing, &args) {
        return Err(TriggerError::NeedsAttention {
            name: cr.name_any(),
            gateway,
            namespace: args.hub_namespace.clone(),
            reason: failure_reason(cr),
        });
    }
    let cr = recycler_for(&args, &existing);
    let name = cr.name_any();
    // A finished recycle of the same deployment makes way for the new one: that very object
    // (preconditions), never one a racing trigger created since the list.
    if let Some(finished) = existing.iter().find(|c| c.name_any() == name) {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: finished.uid(),
                resource_version: finished.resource_version(),
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => {}
            // Gone already, or replaced by another trigger: the create below tells which.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
            Err(e) => return Err(e.into()),
        }
        let uid = finished.uid().unwrap_or_default();
        let gone = kube::runtime::wait::await_condition(
            api.clone(),
            &name,
            kube::runtime::conditions::is_deleted(&uid),
        );
        let _ = tokio::time::timeout(std::time::Duration::from_secs(30), gone).await;
    }
    match api.create(&PostParams::default(), &cr).await {
        Ok(_) => {}
        // Another trigger (or the rebalancer) created it since the list.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let state = api.get_opt(&name).await?.map_or_else(
                || "deleted meanwhile".to_owned(),
                |cr| cr.state().to_string(),
            );
            return Err(TriggerError::InProgress {
                name,
                gateway,
                state,
            });
        }
        Err(e) => return Err(e.into()),
    }
    println!("created recycle {name}");
    if !args.wait {
        return Ok(());
    }
    follow(&api, &name).await
}

/// Prints each state change until `end` (Ok) or `error_state` (Err).
async fn follow(api: &Api<WorkerSliceGwRecycler>, name: &str) -> Result<(), TriggerError> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = std::pin::pin!(
        watcher(api.clone(), config)
            .default_backoff()
            .applied_objects()
    );
    let mut last: Option<State> = None;
    while let Some(cr) = stream.next().await {
        let cr = match cr {
            Ok(cr) => cr,
            Err(error) => {
                eprintln!("watch: {error}");
                continue;
            }
        };
        let state = cr.state();
        if last.as_ref() != Some(&state) {
            println!("state: {state}");
            last = Some(state.clone());
        }
        match state {
            State::End => return Ok(()),
            State::Error => {
                let reason = failure_reason(&cr);
                return Err(TriggerError::Failed {
                    name: name.to_owned(),
                    reason,
                });
            }
            _ => {}
        }
    }
    Err(TriggerError::Vanished(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_apis::worker::{ClientStatus, WorkerSliceGwRecyclerStatus};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TriggerArgs,
    }

    #[test]
    fn trigger_creates_the_reference_name_and_labels() {
        let cli = Cli::parse_from([
            "t",
            "--hub-kubeconfig",
            "/k",
            "--hub-namespace",
            "kubeslice-p",
            "--slice",
            "red",
            "--server-gateway",
            "red-a-b",
            "--client-gateway",
            "red-b-a",
            "--instance",
            "1",
        ]);
        let cr = recycler_for(&cli.args, &[]);
        let v = serde_json::to_value(&cr).expect("json");
        assert_eq!(v["metadata"]["name"], "red-a-b-1-0");
        assert_eq!(v["metadata"]["labels"]["slice_name"], "red");
        assert_eq!(v["metadata"]["labels"]["slicegw_name"], "red-a-b");
        assert_eq!(v["spec"]["gwPair"]["serverId"], "red-a-b-1-0");
        assert_eq!(v["spec"]["gwPair"]["clientId"], "red-b-a-1-0");
        assert_eq!(v["spec"]["state"], "init");
        assert_eq!(v["spec"]["request"], "none");
        assert_eq!(v["spec"]["sliceName"], "red");
        // A recycle in progress for the same server gateway blocks a second one.
        let mut busy = cr.clone();
        busy.spec.state = Some(State::from("slicerouter_updated_state"));
        assert!(in_progress(std::slice::from_ref(&busy), &cli.args).is_some());
        // So does one of the reverse pair (the client gateway on the server side).
        let mut reverse = busy.clone();
        reverse.spec.slice_gw_server = Some("red-b-a".into());
        reverse.spec.slice_gw_client = Some("red-a-b".into());
        assert!(in_progress(std::slice::from_ref(&reverse), &cli.args).is_some());
        busy.spec.state = Some(State::from("end"));
        assert!(in_progress(&[busy], &cli.args).is_none());
    }
    /// A finished recycle named `server` (of `client`), in `end` since second `since`; the
    /// client recorded the deployment it created, if `recycled_client`.
    fn finished(
        server: &str,
        client: &str,
        since: u32,
        recycled_client: Option<&str>,
    ) -> WorkerSliceGwRecycler {
        let mut cr = new_recycler("kubeslice-p", "red", "red-a-b", "red-b-a", server, client);
        cr.spec.state = Some(State::End);
        cr.metadata.annotations = Some(
            [(
                crate::recycler::ANNOTATION_STATE_SINCE.to_owned(),
                format!("2026-12-07T09:00:{since:02}Z"),
            )]
            .into(),
        );
        cr.status = Some(WorkerSliceGwRecyclerStatus {
            client: Some(ClientStatus {
                recycled_client: recycled_client.map(str::to_owned),
                ..ClientStatus::default()
            }),
            ..WorkerSliceGwRecyclerStatus::default()
        });
        cr
    }

    /// The demo's second trigger of the same instance: the hub's finished recycles say which
    /// generation runs now, so the default names it rather than generation 0.
    #[test]
    fn a_trigger_names_the_generation_the_finished_recycles_left() {
        let mut args = TriggerArgs::new("/hub", "kubeslice-p", "red", "red-a-b", "red-b-a");
        args.instance = 1;
        let pair_of = |args: &TriggerArgs, existing: &[WorkerSliceGwRecycler]| {
            let cr = recycler_for(args, existing);
            let ids = cr.spec.gw_pair.clone().expect("a pair");
            (
                cr.name_any(),
                ids.server_id.expect("server"),
                ids.client_id.expect("client"),
            )
        };
        let named = |name: &str, server: &str, client: &str| {
            (name.to_owned(), server.to_owned(), client.to_owned())
        };
        assert_eq!(
            pair_of(&args, &[]),
            named("red-a-b-1-0", "red-a-b-1-0", "red-b-a-1-0")
        );
        // One recycle finished: its successors run. The client's own record wins over the flip.
        let first = finished("red-a-b-1-0", "red-b-a-1-0", 10, Some("red-b-a-1-1"));
        assert_eq!(
            pair_of(&args, std::slice::from_ref(&first)),
            named("red-a-b-1-1", "red-a-b-1-1", "red-b-a-1-1")
        );
        // A newer one flipped them back (its client recorded nothing: the flip of its client).
        let second = finished("red-a-b-1-1", "red-b-a-1-1", 20, None);
        let both = [second, first.clone()];
        assert_eq!(
            pair_of(&args, &both),
            named("red-a-b-1-0", "red-a-b-1-0", "red-b-a-1-0")
        );
        // Another instance's, an unfinished one, or another pair's say nothing of instance 1.
        let other_instance = finished("red-a-b-0-0", "red-b-a-0-0", 30, None);
        let mut failed = finished("red-a-b-1-0", "red-b-a-1-0", 40, None);
        failed.spec.state = Some(State::Error);
        let mut other_pair = finished("red-a-b-1-0", "red-b-a-1-0", 50, None);
        other_pair.spec.slice_gw_client = Some("red-c-a".into());
        let noise = [first.clone(), other_instance, failed, other_pair];
        assert_eq!(
            pair_of(&args, &noise),
            named("red-a-b-1-1", "red-a-b-1-1", "red-b-a-1-1")
        );
        // Deployments named on the command line win.
        args.server_deployment = Some("red-a-b-1-0".into());
        args.client_deployment = Some("red-b-a-1-0".into());
        assert_eq!(
            pair_of(&args, &[first]),
            named("red-a-b-1-0", "red-a-b-1-0", "red-b-a-1-0")
        );
    }

    #[test]
    fn to_args_parses_back_into_the_same_trigger() {
        #[derive(Parser)]
        struct Binary {
            #[command(subcommand)]
            command: crate::cli::Command,
        }
        let parse = |args: &TriggerArgs| {
            let argv = std::iter::once("gw-recycler".to_owned()).chain(args.to_args());
            let crate::cli::Command::Trigger(parsed) = Binary::parse_from(argv).command;
            parsed
        };
        let plain = TriggerArgs::new("/hub", "kubeslice-p", "red", "red-a-b", "red-b-a");
        assert_eq!(
            plain.to_args().join(" "),
            "trigger --hub-kubeconfig /hub --hub-namespace kubeslice-p --slice red \
             --server-gateway red-a-b --client-gateway red-b-a"
        );
        assert_eq!(parse(&plain), plain);
        let every = TriggerArgs {
            instance: 1,
            server_deployment: Some("red-a-b-1-1".into()),
            client_deployment: Some("red-b-a-1-1".into()),
            wait: true,
            ..plain
        };
        assert_eq!(parse(&every), every);
    }
}
