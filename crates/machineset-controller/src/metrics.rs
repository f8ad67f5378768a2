//! MCM's metric names for MachineSets and MachineDeployments (`mcm_machine_set_*`,
//! `mcm_machine_deployment_*`), refreshed from the caches, and the counters of this process's
//! Machine creates and deletes.

use capstan_apis::machine::{MachineDeployment, MachineSet};
use capstan_runtime::own_writes::OwnWrites;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabels {
    name: String,
    namespace: String,
}

capstan_runtime::metric_families! {
    /// The set and deployment metric families.
    #[derive(Clone, Debug)]
    pub struct SetMetrics {
        /// Count of machine sets currently managed by the mcm
        set_items: Gauge = "mcm_machine_set_items_total",
        /// Number of desired replicas of the machine set
        set_spec_replicas: Family<ObjectLabels, Gauge> = "mcm_machine_set_info_spec_replicas",
        /// Number of actual replicas of the machine set
        set_replicas: Family<ObjectLabels, Gauge> = "mcm_machine_set_status_replicas",
        /// Number of ready replicas of the machine set
        set_ready: Family<ObjectLabels, Gauge> = "mcm_machine_set_status_ready_replicas",
        /// Number of available replicas of the machine set
        set_available: Family<ObjectLabels, Gauge> = "mcm_machine_set_status_available_replicas",
        /// Count of machine deployments currently managed by the mcm
        deployment_items: Gauge = "mcm_machine_deployment_items_total",
        /// Number of desired replicas of the machine deployment
        deployment_spec_replicas: Family<ObjectLabels, Gauge> = "mcm_machine_deployment_info_spec_replicas",
        /// Whether the machine deployment is paused (1) or not (0)
        deployment_paused: Family<ObjectLabels, Gauge> = "mcm_machine_deployment_info_spec_paused",
        /// Number of machines of the machine deployment not being deleted
        deployment_replicas: Family<ObjectLabels, Gauge> = "mcm_machine_deployment_status_replicas",
        /// Number of machines of the machine deployment made from its current template
        deployment_updated: Family<ObjectLabels, Gauge> = "mcm_machine_deployment_status_updated_replicas",
        /// Number of available machines of the machine deployment
        deployment_available: Family<ObjectLabels, Gauge> = "mcm_machine_deployment_status_available_replicas",
        /// Number of machines the machine deployment still lacks for full availability
        deployment_unavailable: Family<ObjectLabels, Gauge> = "mcm_machine_deployment_status_unavailable_replicas",
        /// Machines this process created for machine sets
        machines_created: Counter = "capstan_machineset_machines_created",
        /// Machines this process deleted for machine sets (surplus and failed)
        machines_deleted: Counter = "capstan_machineset_machines_deleted",
    }
}

fn labels(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectLabels {
    ObjectLabels {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SetMetrics {
    pub fn created(&self, n: usize) {
        self.machines_created
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    pub fn deleted(&self, n: usize) {
        self.machines_deleted
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    /// Re-exports the gauges from the caches.
    pub fn refresh(
        &self,
        sets: &OwnWrites<MachineSet>,
        deployments: &OwnWrites<MachineDeployment>,
    ) {
        let sets = sets.store().state();
        self.set_items.set(gauge(sets.len()));
        for family in [
            &self.set_spec_replicas,
            &self.set_replicas,
            &self.set_ready,
            &self.set_available,
        ] {
            family.clear();
        }
        for set in &sets {
            let l = labels(&set.metadata);
            let status = set.status.clone().unwrap_or_default();
            self.set_spec_replicas
                .get_or_create(&l)
                .set(set.spec.replicas.into());
            self.set_replicas
                .get_or_create(&l)
                .set(status.replicas.into());
            self.set_ready
                .get_or_create(&l)
                .set(status.ready_replicas.into());
            self.set_available
                .get_or_create(&l)
                .set(status.available_replicas.into());
        }
        let deployments = deployments.store().state();
        self.deployment_items.set(gauge(deployments.len()));
        for family in [
            &self.deployment_spec_replicas,
            &self.deployment_paused,
            &self.deployment_replicas,
            &self.deployment_updated,
            &self.deployment_available,
            &self.deployment_unavailable,
        ] {
            family.clear();
        }
        for d in &deployments {
            let l = labels(&d.metadata);
            let status = d.status.clone().unwrap_or_default();
            self.deployment_spec_replicas
                .get_or_create(&l)
                .set(d.spec.replicas.into());
            self.deployment_paused
                .get_or_create(&l)
                .set(i64::from(d.spec.paused));
            self.deployment_replicas
                .get_or_create(&l)
                .set(status.replicas.into());
            self.deployment_updated
                .get_or_create(&l)
                .set(status.updated_replicas.into());
            self.deployment_available
                .get_or_create(&l)
                .set(status.available_replicas.into());
            self.deployment_unavailable
                .get_or_create(&l)
                .set(status.unavailable_replicas.into());
        }
    }
}
