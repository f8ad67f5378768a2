//! MCM's metric names (`mcm_machine_*`, `mcm_cloud_api_*`) and a [`Driver`] wrapper that counts
//! and times every provider call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use capstan_apis::machine::Machine;
use k8s_openapi::api::core::v1::PersistentVolumeSpec;
use kube::runtime::reflector::Store;
use machine_driver::{
    Driver, DriverFuture, ListMachinesRequest, MachineInfo, MachineRequest, MachineStatusInfo,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MachineLabels {
    name: String,
    namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MachineInfoLabels {
    name: String,
    namespace: String,
    spec_provider_id: String,
    spec_class_kind: String,
    spec_class_name: String,
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CloudLabels {
    provider: String,
    service: String,
}

type DurationFamily = Family<CloudLabels, Histogram, fn() -> Histogram>;

fn driver_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

capstan_runtime::metric_families! {
    /// The MCM metric families.
    #[derive(Clone, Debug)]
    pub struct McmMetrics {
        /// Count of machines currently managed by the mcm
        items: Gauge = "mcm_machine_items_total",
        /// Current status phase of the Machines (Terminating -4, Failed -3, CrashLoopBackOff -2,
        /// Unknown -1, Pending 0, Running 1)
        phase: Family<MachineLabels, Gauge> = "mcm_machine_current_status_phase",
        /// Information of the Machines currently managed by the mcm
        info: Family<MachineInfoLabels, Gauge> = "mcm_machine_info",
        /// Number of Cloud Service API requests, partitioned by provider and service
        // prometheus-client appends `_total` to counters.
        requests: Family<CloudLabels, Counter> = "mcm_cloud_api_requests",
        /// Number of Failed Cloud Service API requests, partitioned by provider and service
        failed: Family<CloudLabels, Counter> = "mcm_cloud_api_requests_failed",
        /// Orphan VMs (no Machine accounts for them) the safety sweep deleted
        orphans: Counter = "capstan_machineclass_orphan_vms_deleted",
        /// Time taken by one driver call, partitioned by provider and service
        durations: DurationFamily = "mcm_cloud_api_driver_request_duration" in Seconds
            => DurationFamily::new_with_constructor(driver_histogram),
    }
}

impl McmMetrics {
    /// Counts orphan VMs the safety sweep deleted.
    pub fn orphans_deleted(&self, n: usize) {
        self.orphans.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    /// Re-exports the machine gauges from the cache (items, phase, info).
    pub fn refresh(&self, machines: &Store<Machine>) {
        let all = machines.state();
        self.items.set(i64::try_from(all.len()).unwrap_or(i64::MAX));
        self.phase.clear();
        self.info.clear();
        for m in all {
            let name = m.metadata.name.clone().unwrap_or_default();
            let namespace = m.metadata.namespace.clone().unwrap_or_default();
            if let Some(value) = m.phase().and_then(|p| p.metric_value()) {
                self.phase
                    .get_or_create(&MachineLabels {
                        name: name.clone(),
                        namespace: namespace.clone(),
                    })
                    .set(value);
            }
            let class = m.spec.class.clone().unwrap_or_default();
            self.info
                .get_or_create(&MachineInfoLabels {
                    name,
                    namespace,
                    spec_provider_id: m.spec.provider_id.clone().unwrap_or_default(),
                    spec_class_kind: class.kind.unwrap_or_default(),
                    spec_class_name: class.name.unwrap_or_default(),
                    node: m.node_name().unwrap_or_default().to_owned(),
                })
                .set(1);
        }
    }
}

/// A [`Driver`] that records `mcm_cloud_api_*` for every call of the inner driver.
pub struct MeteredDriver {
    inner: Arc<dyn Driver>,
    provider: String,
    metrics: McmMetrics,
}

impl MeteredDriver {
    pub fn new(inner: Arc<dyn Driver>, provider: &str, metrics: McmMetrics) -> Self {
        Self {
            inner,
            provider: provider.to_owned(),
            metrics,
        }
    }

    fn observe<'a, T: Send + 'a>(
        &'a self,
        service: &'static str,
        call: DriverFuture<'a, T>,
    ) -> DriverFuture<'a, T> {
        Box::pin(async move {
            let labels = CloudLabels {
                provider: self.provider.clone(),
                service: service.to_owned(),
            };
            let start = Instant::now();
            let result = call.await;
            self.metrics
                .durations
                .get_or_create(&labels)
                .observe(start.elapsed().as_secs_f64());
            self.metrics.requests.get_or_create(&labels).inc();
            if result.is_err() {
                self.metrics.failed.get_or_create(&labels).inc();
            }
            result
        })
    }
}

impl Driver for MeteredDriver {
    fn create_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, MachineInfo> {
        self.observe("CreateMachine", self.inner.create_machine(request))
    }

    fn initialize_machine<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineInfo> {
        self.observe("InitializeMachine", self.inner.initialize_machine(request))
    }

    fn delete_machine<'a>(&'a self, request: &'a MachineRequest) -> DriverFuture<'a, String> {
        self.observe("DeleteMachine", self.inner.delete_machine(request))
    }

    fn get_machine_status<'a>(
        &'a self,
        request: &'a MachineRequest,
    ) -> DriverFuture<'a, MachineStatusInfo> {
        self.observe("GetMachineStatus", self.inner.get_machine_status(request))
    }

    fn list_machines<'a>(
        &'a self,
        request: &'a ListMachinesRequest,
    ) -> DriverFuture<'a, BTreeMap<String, String>> {
        self.observe("ListMachines", self.inner.list_machines(request))
    }

    fn get_volume_ids<'a>(
        &'a self,
        specs: &'a [PersistentVolumeSpec],
    ) -> DriverFuture<'a, Vec<String>> {
        self.observe("GetVolumeIDs", self.inner.get_volume_ids(specs))
    }
}
