//! MachineDeployments end to end: kube-sim, the real `machineset-controller` and the real
//! `machineclass-controller` with its simulated provider, so Machines really go Pending, Running
//! and away. Scale up and down through the scale subresource (the autoscaler's marked Machines
//! go first), a rolling class change sampled the whole time, and kill -9 in the middle of a roll.

use std::collections::BTreeSet;
use std::time::Duration;

use capstan_apis::machine::{
    ANNOTATION_MACHINE_PRIORITY, Machine, MachineDeployment, MachinePhase, MachineSet,
};
use capstan_scenarios::tools::binary;
use capstan_testkit::objects;
use capstan_testkit::process::BinaryUnderTest;
use capstan_testkit_sim::SimCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NS: &str = "default";
const T: Duration = Duration::from_secs(60);

struct Env {
    cluster: SimCluster,
    machines_bin: BinaryUnderTest,
    sets_bin: Option<BinaryUnderTest>,
}

impl Env {
    /// kube-sim, a Secret, classes `c1` and `c2`, and both controllers.
    async fn start() -> Self {
        let cluster = SimCluster::start().await;
        let secret = objects::secret(NS, "cloud", &[("userData", "Y2xvdWQtaW5pdA==")]);
        Api::<Secret>::namespaced(cluster.client.clone(), NS)
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
        for class in ["c1", "c2"] {
            let body = objects::machine_class(NS, class, "cloud", json!({}));
            let api: Api<capstan_apis::machine::MachineClass> =
                Api::namespaced(cluster.client.clone(), NS);
            api.create(&PostParams::default(), &objects::from_json(body))
                .await
                .expect("class");
        }
        let machines_bin = cluster
            .spawn(
                binary("machineclass-controller", "machineclass-controller")
                    .to_str()
                    .expect("path"),
                &[
                    "--namespace",
                    NS,
                    "--short-retry",
                    "500ms",
                    "--sim-ready-delay",
                    "1s",
                ],
            )
            .await;
        let mut env = Self {
            cluster,
            machines_bin,
            sets_bin: None,
        };
        env.start_sets().await;
        env
    }

    async fn start_sets(&mut self) {
        self.start_sets_with(&[]).await;
    }

    async fn start_sets_with(&mut self, extra: &[&str]) {
        let path = binary("machineset-controller", "machineset-controller");
        let log = "debug,kube=warn,hyper=warn,tower=warn,h2=warn,rustls=warn";
        let mut args = vec![
            "--namespace",
            NS,
            "--short-retry",
            "200ms",
            "--log-level",
            log,
        ];
        args.extend_from_slice(extra);
        let bin = self
            .cluster
            .spawn(path.to_str().expect("path"), &args)
            .await;
        self.sets_bin = Some(bin);
    }

    fn output(&self) -> String {
        let sets = self
            .sets_bin
            .as_ref()
            .map(|b| b.output().join("\n"))
            .unwrap_or_default();
        let tail = |lines: Vec<String>| lines[lines.len().saturating_sub(60)..].join("\n");
        format!(
            "machineset-controller:\n{sets}\nmachineclass-controller (last lines):\n{}",
            tail(self.machines_bin.output())
        )
    }

    fn machines(&self) -> Api<Machine> {
        Api::namespaced(self.cluster.client.clone(), NS)
    }

    fn sets(&self) -> Api<MachineSet> {
        Api::namespaced(self.cluster.client.clone(), NS)
    }

    fn deployments(&self) -> Api<MachineDeployment> {
        Api::namespaced(self.cluster.client.clone(), NS)
    }

    async fn until<T, F, Fut>(&self, what: &str, probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        capstan_testkit::eventually_with(what, T, || self.output(), probe).await
    }

    async fn deployment(&self, name: &str, replicas: i32, class: &str, strategy: Value) {
        let body = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"name": name}},
                "strategy": strategy,
                "template": {
                    "metadata": {"labels": {"name": name}},
                    "spec": {"class": {"kind": "MachineClass", "name": class}}
                }
            }
        });
        self.deployments()
            .create(&PostParams::default(), &objects::from_json(body))
            .await
            .expect("deployment");
    }

    /// `kubectl scale`'s request: a merge patch of the scale subresource.
    async fn scale(&self, name: &str, replicas: i32) {
        self.deployments()
            .patch_scale(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scaled");
    }

    async fn all_machines(&self) -> Vec<Machine> {
        self.machines()
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
    }

    /// The simulated provider's VMs (one ConfigMap each).
    async fn vm_count(&self) -> usize {
        Api::<ConfigMap>::namespaced(self.cluster.client.clone(), NS)
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("sim-vm-"))
            })
            .count()
    }
}

fn name(m: &Machine) -> String {
    m.metadata.name.clone().unwrap_or_default()
}

fn running(m: &Machine) -> bool {
    m.metadata.deletion_timestamp.is_none() && m.phase() == Some(&MachinePhase::Running)
}

fn class_of(m: &Machine) -> String {
    m.spec
        .class
        .as_ref()
        .and_then(|c| c.name.clone())
        .unwrap_or_default()
}

/// Exactly `n` Machines, all Running, of class `class`.
async fn settled(env: &Env, n: usize, class: &str) -> Vec<Machine> {
    env.until(
        &format!("{n} Running machines of {class} and nothing else"),
        || async {
            let all = env.all_machines().await;
            (all.len() == n && all.iter().all(|m| running(m) && class_of(m) == class))
                .then_some(all)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_0_5_2_removes_the_machines_the_autoscaler_marked() {
    let env = Env::start().await;
    env.deployment("pool-a", 0, "c1", json!({})).await;
    // The set exists at 0 before any Machine does.
    env.until("an empty machine set", || async {
        let sets = env.sets().list(&ListParams::default()).await.ok()?.items;
        (sets.len() == 1 && sets[0].spec.replicas == 0).then_some(())
    })
    .await;
    env.scale("pool-a", 5).await;
    let five = settled(&env, 5, "c1").await;
    env.until("the deployment reports 5 of 5 available", || async {
        let status = env.deployments().get("pool-a").await.ok()?.status?;
        let counts = (
            status.replicas,
            status.updated_replicas,
            status.available_replicas,
        );
        (counts == (5, 5, 5)).then_some(())
    })
    .await;

    // The cluster-autoscaler marks the Machines it wants gone, then lowers the replicas.
    let doomed: BTreeSet<String> = five.iter().take(3).map(name).collect();
    for m in &doomed {
        let patch = json!({"metadata": {"annotations": {ANNOTATION_MACHINE_PRIORITY: "1"}}});
        env.machines()
            .patch(m, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .expect("annotated");
    }
    env.scale("pool-a", 2).await;
    let two = settled(&env, 2, "c1").await;
    let kept: BTreeSet<String> = two.iter().map(name).collect();
    assert!(
        kept.is_disjoint(&doomed),
        "kept {kept:?}, marked {doomed:?}"
    );
    let kept_before: BTreeSet<String> = five
        .iter()
        .map(name)
        .filter(|n| !doomed.contains(n))
        .collect();
    assert_eq!(kept, kept_before, "the two unmarked machines stay");
    env.until("2 VMs left", || async {
        (env.vm_count().await == 2).then_some(())
    })
    .await;
}

/// Samples the Machines until the roll ends; panics if there were ever fewer than `min_running`
/// Running or more than `max_live` Machines (Terminating included).
async fn sample_roll(
    env: &Env,
    min_running: usize,
    max_live: usize,
    done: impl Fn(&[Machine]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let all = env.all_machines().await;
        let running = all.iter().filter(|m| running(m)).count();
        // Every Machine object counts, Terminating ones included (their VMs still run).
        let live = all.len();
        assert!(
            running >= min_running,
            "only {running} running: {:?}\n{}",
            all.iter().map(name).collect::<Vec<_>>(),
            env.output()
        );
        assert!(
            live <= max_live,
            "{live} machines at once\n{}",
            env.output()
        );
        if done(&all) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the roll did not finish\n{}",
            env.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn rolled_to(class: &str, n: usize) -> impl Fn(&[Machine]) -> bool + '_ {
    move |all: &[Machine]| all.len() == n && all.iter().all(|m| running(m) && class_of(m) == class)
}

async fn change_class(env: &Env, deployment: &str, class: &str) {
    let patch =
        json!({"spec": {"template": {"spec": {"class": {"kind": "MachineClass", "name": class}}}}});
    env.deployments()
        .patch(deployment, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("class changed");
}

/// One set at `replicas` of class `class`, the old ones at 0.
async fn assert_sets_after_roll(env: &Env, class: &str, replicas: i32) {
    let sets = env
        .sets()
        .list(&ListParams::default())
        .await
        .expect("sets")
        .items;
    let (new, old): (Vec<&MachineSet>, Vec<&MachineSet>) = sets.iter().partition(|s| {
        s.spec
            .template
            .as_ref()
            .and_then(|t| t.spec.as_ref())
            .and_then(|s| s.class.as_ref())
            .and_then(|c| c.name.as_deref())
            == Some(class)
    });
    assert_eq!(new.len(), 1, "{sets:?}");
    assert_eq!(new[0].spec.replicas, replicas);
    assert!(old.iter().all(|s| s.spec.replicas == 0), "{old:?}");
    // Statuses held back while Machines changed are written once they settle.
    env.until("the statuses report the settled roll", || async {
        let sets = env.sets().list(&ListParams::default()).await.ok()?.items;
        let sets_settled = sets.iter().all(|s| {
            let st = s.status.clone().unwrap_or_default();
            st.replicas == s.spec.replicas
                && st.ready_replicas == s.spec.replicas
                && st.available_replicas == s.spec.replicas
        });
        let deployments = env
            .deployments()
            .list(&ListParams::default())
            .await
            .ok()?
            .items;
        let deployments_settled = deployments.iter().all(|d| {
            let st = d.status.clone().unwrap_or_default();
            let want = d.spec.replicas;
            (
                st.replicas,
                st.updated_replicas,
                st.available_replicas,
                st.unavailable_replicas,
            ) == (want, want, want, 0)
        });
        (sets_settled && deployments_settled).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_class_change_never_drops_below_3_running_nor_above_4_machines() {
    let env = Env::start().await;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    env.deployment("pool-a", 3, "c1", strategy).await;
    settled(&env, 3, "c1").await;
    change_class(&env, "pool-a", "c2").await;
    sample_roll(&env, 3, 4, rolled_to("c2", 3)).await;
    assert_sets_after_roll(&env, "c2", 3).await;
    let d = env
        .until("the deployment reports the roll done", || async {
            let d = env.deployments().get("pool-a").await.ok()?;
            let s = d.status.clone()?;
            (s.updated_replicas == 3 && s.available_replicas == 3 && s.replicas == 3).then_some(d)
        })
        .await;
    let revision = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("deployment.kubernetes.io/revision"))
        .cloned();
    assert_eq!(revision.as_deref(), Some("2"));
    env.until("3 VMs", || async {
        (env.vm_count().await == 3).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_the_middle_of_a_roll_resumes_with_no_extra_vm() {
    let mut env = Env::start().await;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    env.deployment("pool-a", 3, "c1", strategy).await;
    settled(&env, 3, "c1").await;
    change_class(&env, "pool-a", "c2").await;
    // Kill the controller at three points of the roll: new set made, a new Machine up, an old one gone.
    for at_least_c2 in 1..=3 {
        env.until(&format!("{at_least_c2} machine(s) of c2"), || async {
            let all = env.all_machines().await;
            (all.iter().filter(|m| class_of(m) == "c2").count() >= at_least_c2).then_some(())
        })
        .await;
        let mut bin = env.sets_bin.take().expect("running");
        bin.signal(nix::sys::signal::Signal::SIGKILL)
            .expect("killed");
        bin.wait_exit(Duration::from_secs(10))
            .await
            .expect("exited");
        env.start_sets().await;
    }
    sample_roll(&env, 3, 4, rolled_to("c2", 3)).await;
    assert_sets_after_roll(&env, "c2", 3).await;
    env.until("exactly 3 VMs", || async {
        (env.vm_count().await == 3).then_some(())
    })
    .await;
}

/// MCM's safety controller: a set backed by `2 * replicas + safetyUp` Machines or more is frozen
/// (label and condition), and thawed once the count falls to the lower limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_backed_by_too_many_machines_is_frozen_then_thawed() {
    let mut env = Env::start().await;
    if let Some(mut bin) = env.sets_bin.take() {
        bin.signal(nix::sys::signal::Signal::SIGKILL)
            .expect("killed");
        bin.wait_exit(Duration::from_secs(10))
            .await
            .expect("exited");
    }
    env.start_sets_with(&["--machine-safety-overshooting-period", "200ms"])
        .await;
    let body = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineSet",
        "metadata": {"name": "solo", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"name": "solo"}},
            "template": {"metadata": {"labels": {"name": "solo"}},
                         "spec": {"class": {"kind": "MachineClass", "name": "c1"}}}
        }
    });
    let set: MachineSet = env
        .sets()
        .create(&PostParams::default(), &objects::from_json(body))
        .await
        .expect("set");
    // Four more Machines claim the set and are held by a finalizer: the set deletes the surplus
    // (its own Machine, the oldest, really goes), but the held ones stay (Terminating), so 4 back
    // it: 2 * 1 + 2, the freeze limit.
    env.until("the set's own machine", || async {
        (env.all_machines().await.len() == 1).then_some(())
    })
    .await;
    for i in 0..4 {
        let machine = json!({
            "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "Machine",
            "metadata": {"name": format!("extra-{i}"), "namespace": NS,
                         "labels": {"name": "solo"},
                         "finalizers": ["test.capstan.dev/hold"],
                         "ownerReferences": [{"apiVersion": "machine.sapcloud.io/v1alpha1",
                             "kind": "MachineSet", "name": "solo",
                             "uid": set.metadata.uid.clone().expect("uid"), "controller": true}]},
            "spec": {"class": {"kind": "MachineClass", "name": "c1"}}
        });
        env.machines()
            .create(&PostParams::default(), &objects::from_json(machine))
            .await
            .expect("machine");
    }
    let frozen = env
        .until("the set frozen", || async {
            let set = env.sets().get("solo").await.ok()?;
            let labelled = set.metadata.labels.as_ref()?.get("freeze")? == "True";
            labelled.then_some(set)
        })
        .await;
    let condition = frozen
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_.as_str() == "Frozen"))
        .expect("Frozen condition");
    assert_eq!(
        condition.reason.as_deref(),
        Some("OverShootingReplicaCount")
    );
    // 4 or 5, depending on whether the set's own Machine was gone before the pass.
    let message = condition.message.unwrap_or_default();
    assert!(
        message.starts_with("The number of machines backing MachineSet: solo is ")
            && message.ends_with(" >= 4 which is the Max-ScaleUp-Limit"),
        "{message}"
    );
    // Let the held Machines go: the count falls back and the set thaws.
    for i in 0..4 {
        let patch = json!({"metadata": {"finalizers": null}});
        let _ = env
            .machines()
            .patch(
                &format!("extra-{i}"),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await;
    }
    env.until("the set thawed", || async {
        let set = env.sets().get("solo").await.ok()?;
        let labelled = set
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("freeze"))
            .is_some();
        let conditioned = set
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_.as_str() == "Frozen"));
        (!labelled && !conditioned).then_some(())
    })
    .await;
}

/// Bad input is refused with the field and the reason, and nothing is rolled: a deployment whose
/// maxSurge and maxUnavailable are both 0 could never replace a Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_that_could_never_roll_is_refused_naming_the_fields() {
    use k8s_openapi::api::events::v1::Event;
    let env = Env::start().await;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 0}});
    env.deployment("stuck", 2, "c1", strategy).await;
    let events: Api<Event> = Api::namespaced(env.cluster.client.clone(), NS);
    let note = env
        .until("a Warning naming the fields", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                (e.reason.as_deref() == Some("InvalidSpec")
                    && e.regarding.as_ref()?.name.as_deref() == Some("stuck"))
                .then_some(e.note)
                .flatten()
            })
        })
        .await;
    assert!(
        note.contains("spec.strategy.rollingUpdate: maxSurge and maxUnavailable are both 0"),
        "{note}"
    );
    // An empty selector would select every Machine: MCM's SelectingAll.
    let all = json!({
        "apiVersion": "machine.sapcloud.io/v1alpha1", "kind": "MachineDeployment",
        "metadata": {"name": "all", "namespace": NS},
        "spec": {"replicas": 1, "selector": {},
                 "template": {"metadata": {"labels": {"name": "all"}},
                              "spec": {"class": {"kind": "MachineClass", "name": "c1"}}}}
    });
    env.deployments()
        .create(&PostParams::default(), &objects::from_json(all))
        .await
        .expect("deployment");
    env.until("a SelectingAll Warning", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .any(|e| {
                e.reason.as_deref() == Some("SelectingAll")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("all")
            })
            .then_some(())
    })
    .await;
    assert!(
        env.sets()
            .list(&ListParams::default())
            .await
            .expect("sets")
            .items
            .is_empty()
    );
    // Fixed, it rolls.
    let patch = json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}});
    env.deployments()
        .patch("stuck", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("fixed");
    settled(&env, 2, "c1").await;
}

/// A replicas change in the middle of a roll is shared over the old and new sets (MCM's
/// proportional scaling), and the roll still ends with every Machine on the new class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_in_the_middle_of_a_roll_converges() {
    let env = Env::start().await;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
    env.deployment("pool-a", 3, "c1", strategy).await;
    settled(&env, 3, "c1").await;
    change_class(&env, "pool-a", "c2").await;
    env.until("the roll under way", || async {
        let all = env.all_machines().await;
        all.iter().any(|m| class_of(m) == "c2").then_some(())
    })
    .await;
    env.scale("pool-a", 5).await;
    settled(&env, 5, "c2").await;
    assert_sets_after_roll(&env, "c2", 5).await;
}

/// The cluster-autoscaler's other path: it names the Machine to remove on the deployment
/// (`trigger-deletion-by-mcm`) and lowers the replicas in the same write; that Machine goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machine_the_autoscaler_names_on_the_deployment_goes() {
    let env = Env::start().await;
    env.deployment("pool-a", 3, "c1", json!({})).await;
    let three = settled(&env, 3, "c1").await;
    let doomed = name(&three[1]);
    let patch = json!({
        "metadata": {"annotations": {"node.machine.sapcloud.io/trigger-deletion-by-mcm": doomed}},
        "spec": {"replicas": 2}
    });
    env.deployments()
        .patch("pool-a", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("annotated and scaled");
    let two = settled(&env, 2, "c1").await;
    let kept: BTreeSet<String> = two.iter().map(name).collect();
    assert!(!kept.contains(&doomed), "kept {kept:?}, named {doomed}");
    let d = env.deployments().get("pool-a").await.expect("deployment");
    let annotations = d.metadata.annotations.unwrap_or_default();
    assert!(
        annotations
            .contains_key("machine.sapcloud.io/last-deployment-replica-change-by-scaler-time"),
        "{annotations:?}"
    );
}

/// The deprecated `spec.rollbackTo` (revision 0: the one before the newest) takes the deployment
/// back to that template, which then rolls like any change, and the field is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_the_previous_revision_rolls_back() {
    let env = Env::start().await;
    env.deployment("pool-a", 2, "c1", json!({})).await;
    settled(&env, 2, "c1").await;
    change_class(&env, "pool-a", "c2").await;
    settled(&env, 2, "c2").await;
    let patch = json!({"spec": {"rollbackTo": {"revision": 0}}});
    env.deployments()
        .patch("pool-a", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("rollback asked");
    settled(&env, 2, "c1").await;
    let d = env.deployments().get("pool-a").await.expect("deployment");
    assert!(d.spec.rollback_to.is_none(), "rollbackTo is cleared");
    let revision = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("deployment.kubernetes.io/revision"))
        .cloned();
    assert_eq!(
        revision.as_deref(),
        Some("3"),
        "the old set came back as revision 3"
    );
}

/// A new set the API refuses to create is said where an operator looks: a Warning Event
/// `MachineSetCreateError` naming the set and the API's answer, and, once the deployment tracks
/// progress (`progressDeadlineSeconds`), `Progressing False MachineSetCreateError`. When the API
/// takes creates again, the set is made and the deployment rolls out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_set_the_api_refuses_is_reported_then_created_once_it_accepts() {
    use k8s_openapi::api::events::v1::Event;
    use kube_sim::faults::{ErrorRule, FaultConfig};

    let env = Env::start().await;
    env.cluster.sim.set_faults(FaultConfig {
        errors: vec![ErrorRule {
            verbs: vec!["create".into()],
            resources: vec!["machinesets".into()],
            rate: 1.0,
            code: 500,
            retry_after_seconds: 1,
        }],
        ..FaultConfig::default()
    });
    env.deployment("pool-a", 2, "c1", json!({})).await;
    let events: Api<Event> = Api::namespaced(env.cluster.client.clone(), NS);
    let note = env
        .until("a Warning Event about the refused create", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                (e.reason.as_deref() == Some("MachineSetCreateError")
                    && e.type_.as_deref() == Some("Warning"))
                .then(|| e.note.unwrap_or_default())
            })
        })
        .await;
    assert!(
        note.starts_with("Failed to create new machine set \"pool-a-"),
        "{note}"
    );
    env.deployments()
        .patch(
            "pool-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"progressDeadlineSeconds": 600}})),
        )
        .await
        .expect("deadline set");
    let message = env
        .until("Progressing False MachineSetCreateError", || async {
            let d = env.deployments().get("pool-a").await.ok()?;
            d.status?.conditions?.into_iter().find_map(|c| {
                (c.reason.as_deref() == Some("MachineSetCreateError")
                    && c.status == capstan_apis::machine::ConditionStatus::False)
                    .then(|| c.message.unwrap_or_default())
            })
        })
        .await;
    assert!(
        message.starts_with("Failed to create new machine set \"pool-a-"),
        "{message}"
    );
    assert!(env.all_machines().await.is_empty(), "no set, no Machine");

    env.cluster.sim.set_faults(FaultConfig::default());
    settled(&env, 2, "c1").await;
    env.until("Progressing True once rolled out", || async {
        let d = env.deployments().get("pool-a").await.ok()?;
        d.status?.conditions?.into_iter().find(|c| {
            c.reason.as_deref() == Some("NewMachineSetAvailable")
                && c.status == capstan_apis::machine::ConditionStatus::True
        })
    })
    .await;
}
