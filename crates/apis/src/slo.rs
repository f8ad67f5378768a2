//! `slo.koordinator.sh/v1alpha1`: Koordinator's NodeSLO.
//!
//! Every field is optional and skipped when unset, like the reference's `omitempty` pointers, so
//! a spec built by merging JSON and decoding it here serialises back to the same JSON. Numeric
//! bounds are in the CRD schema (`#[schemars(range)]`), so the API server rejects out-of-range
//! values. Unknown fields are dropped, except inside `extensions` which is kept as is.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::wire::{preserve_unknown_object, wire_enum};

/// API group.
pub const GROUP: &str = "slo.koordinator.sh";
/// API version.
pub const VERSION: &str = "v1alpha1";

/// Default namespace of the SLO ConfigMap.
pub const CONFIG_NAMESPACE: &str = "koordinator-system";
/// Default name of the SLO ConfigMap.
pub const CONFIG_NAME: &str = "slo-controller-config";
/// ConfigMap key for `resourceUsedThresholdWithBE`.
pub const CONFIG_KEY_RESOURCE_THRESHOLD: &str = "resource-threshold-config";
/// ConfigMap key for `resourceQOSStrategy`.
pub const CONFIG_KEY_RESOURCE_QOS: &str = "resource-qos-config";
/// ConfigMap key for `cpuBurstStrategy`.
pub const CONFIG_KEY_CPU_BURST: &str = "cpu-burst-config";
/// ConfigMap key for `systemStrategy`.
pub const CONFIG_KEY_SYSTEM: &str = "system-config";
/// ConfigMap key for `hostApplications`.
pub const CONFIG_KEY_HOST_APPLICATION: &str = "host-application-config";
/// Event reason (Warning, on the ConfigMap) when a config key does not parse.
pub const EVENT_REASON_CONFIG_UNMARSHAL_FAILED: &str = "SLOCfgUnmarshalFailed";
/// Node annotation whose quantity overrides `systemStrategy.totalNetworkBandwidth`.
pub const ANNOTATION_NETWORK_BANDWIDTH: &str = "node.koordinator.sh/network-bandwidth";

/// Node-level SLO settings consumed by koordlet. One per Node, same name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "slo.koordinator.sh",
    version = "v1alpha1",
    kind = "NodeSLO",
    doc = "Node-level SLO settings consumed by koordlet; one per Node, same name.",
    root = "NodeSlo",
    plural = "nodeslos",
    singular = "nodeslo",
    printcolumn = r#"{"name":"Threshold","type":"boolean","description":"Whether BE pods are suppressed and evicted on node usage","jsonPath":".spec.resourceUsedThresholdWithBE.enable"}"#,
    printcolumn = r#"{"name":"CPU Suppress %","type":"integer","description":"Node CPU usage above which BE pods are suppressed","jsonPath":".spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent"}"#,
    printcolumn = r#"{"name":"Memory Evict %","type":"integer","description":"Node memory usage above which BE pods are evicted","jsonPath":".spec.resourceUsedThresholdWithBE.memoryEvictThresholdPercent"}"#,
    printcolumn = r#"{"name":"CPU Burst","type":"string","description":"CPU burst policy","priority":1,"jsonPath":".spec.cpuBurstStrategy.policy"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    status = "NodeSloStatus",
    derive = "PartialEq"
)]
pub struct NodeSloSpec {
    /// BE pods are limited when node resource usage is too high.
    #[serde(
        rename = "resourceUsedThresholdWithBE",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_used_threshold_with_be: Option<ResourceThresholdStrategy>,
    /// QoS settings per QoS class.
    #[serde(
        rename = "resourceQOSStrategy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_qos_strategy: Option<ResourceQosStrategy>,
    #[serde(
        rename = "cpuBurstStrategy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_burst_strategy: Option<CpuBurstStrategy>,
    /// Node-wide kernel settings.
    #[serde(
        rename = "systemStrategy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub system_strategy: Option<SystemStrategy>,
    /// Third-party extensions, preserved as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub extensions: Option<serde_json::Map<String, serde_json::Value>>,
    /// QoS management of out-of-band applications.
    #[serde(
        rename = "hostApplications",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub host_applications: Option<Vec<HostApplicationSpec>>,
}

/// NodeSLO status: an empty object, as in the reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct NodeSloStatus {}

/// `resourceUsedThresholdWithBE`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceThresholdStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_suppress_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_suppress_min_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_suppress_policy: Option<CpuSuppressPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub memory_evict_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub memory_evict_lower_percent: Option<i64>,
    #[serde(
        rename = "cpuEvictBESatisfactionUpperPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_evict_be_satisfaction_upper_percent: Option<i64>,
    #[serde(
        rename = "cpuEvictBESatisfactionLowerPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_evict_be_satisfaction_lower_percent: Option<i64>,
    #[serde(
        rename = "cpuEvictBEUsageThresholdPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_evict_be_usage_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cpu_evict_time_window_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_evict_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub cpu_evict_lower_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_evict_policy: Option<CpuEvictPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub memory_allocatable_evict_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub memory_allocatable_evict_lower_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cpu_allocatable_evict_threshold_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cpu_allocatable_evict_lower_percent: Option<i64>,
    /// Highest priority evicted by the xxxEvict features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict_enabled_priority_threshold: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable_evict_priority_threshold: Option<i32>,
}

/// `resourceQOSStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQosStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<ResourceQosPolicies>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lsr_class: Option<ResourceQos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ls_class: Option<ResourceQos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub be_class: Option<ResourceQos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_class: Option<ResourceQos>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_root: Option<ResourceQos>,
}

/// `resourceQOSStrategy.policies`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct ResourceQosPolicies {
    #[serde(rename = "cpuPolicy", default, skip_serializing_if = "Option::is_none")]
    pub cpu_policy: Option<CpuQosPolicy>,
    #[serde(
        rename = "netQOSPolicy",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub net_qos_policy: Option<NetQosPolicy>,
}

/// QoS settings of one QoS class.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct ResourceQos {
    #[serde(rename = "cpuQOS", default, skip_serializing_if = "Option::is_none")]
    pub cpu_qos: Option<CpuQosCfg>,
    #[serde(rename = "memoryQOS", default, skip_serializing_if = "Option::is_none")]
    pub memory_qos: Option<MemoryQosCfg>,
    #[serde(rename = "blkioQOS", default, skip_serializing_if = "Option::is_none")]
    pub blkio_qos: Option<BlkioQosCfg>,
    #[serde(
        rename = "resctrlQOS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resctrl_qos: Option<ResctrlQosCfg>,
    #[serde(
        rename = "networkQOS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub network_qos: Option<NetworkQosCfg>,
}

/// `cpuQOS`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuQosCfg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1, max = 2))]
    pub group_identity: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub sched_idle: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_expeller: Option<bool>,
}

/// `memoryQOS`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryQosCfg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_limit_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub low_limit_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub throttling_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub wmark_ratio: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub wmark_scale_permill: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -25, max = 50))]
    pub wmark_min_adj: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub priority_enable: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 12))]
    pub priority: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub oom_kill_group: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_cache_enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub page_cache_limit_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub page_cache_limit_size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_cache_reclaim_sync: Option<bool>,
}

/// `blkioQOS`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct BlkioQosCfg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<Vec<BlockCfg>>,
}

/// One block device, volume group or pod volume of `blkioQOS`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct BlockCfg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub block_type: Option<BlockType>,
    #[serde(rename = "ioCfg", default, skip_serializing_if = "Option::is_none")]
    pub io_cfg: Option<IoCfg>,
}

/// Throttling and blk-iocost settings of one block.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
pub struct IoCfg {
    #[serde(rename = "readIOPS", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub read_iops: Option<i64>,
    #[serde(rename = "writeIOPS", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub write_iops: Option<i64>,
    #[serde(rename = "readBPS", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub read_bps: Option<i64>,
    #[serde(rename = "writeBPS", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub write_bps: Option<i64>,
    #[serde(
        rename = "ioWeightPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub io_weight_percent: Option<i64>,
    #[serde(
        rename = "readLatency",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub read_latency: Option<i64>,
    #[serde(
        rename = "writeLatency",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub write_latency: Option<i64>,
    #[serde(
        rename = "readLatencyPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub read_latency_percent: Option<i64>,
    #[serde(
        rename = "writeLatencyPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub write_latency_percent: Option<i64>,
    #[serde(
        rename = "enableUserModel",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_user_model: Option<bool>,
    #[serde(
        rename = "modelReadBPS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub model_read_bps: Option<i64>,
    #[serde(
        rename = "modelWriteBPS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub model_write_bps: Option<i64>,
    #[serde(
        rename = "modelReadSeqIOPS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub model_read_seq_iops: Option<i64>,
    #[serde(
        rename = "modelWriteSeqIOPS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub model_write_seq_iops: Option<i64>,
    #[serde(
        rename = "modelReadRandIOPS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub model_read_rand_iops: Option<i64>,
    #[serde(
        rename = "modelWriteRandIOPS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub model_write_rand_iops: Option<i64>,
}

/// `resctrlQOS`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResctrlQosCfg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(
        rename = "catRangeStartPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub cat_range_start_percent: Option<i64>,
    #[serde(
        rename = "catRangeEndPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub cat_range_end_percent: Option<i64>,
    #[serde(
        rename = "mbaPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub mba_percent: Option<i64>,
}

/// `networkQOS`: each value an integer percentage of the node bandwidth or a quantity string (`"50M"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkQosCfg {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_request: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress_limit: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_request: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_limit: Option<IntOrString>,
}

/// `cpuBurstStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuBurstStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<CpuBurstPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub cpu_burst_percent: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfs_quota_burst_percent: Option<i64>,
    /// `-1` means unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cfs_quota_burst_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub share_pool_threshold_percent: Option<i64>,
}

/// `systemStrategy`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_free_kbytes_factor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 400))]
    pub watermark_scale_factor: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub memcg_reap_back_ground: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched_group_identity_enabled: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched_idle_saver_wmark: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched_features: Option<BTreeMap<String, bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub page_cache_limit_enabled: Option<i64>,
    /// Node bandwidth, e.g. `"10G"`; the Node annotation [`ANNOTATION_NETWORK_BANDWIDTH`] overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_network_bandwidth: Option<Quantity>,
}

/// An out-of-band application on the node and its QoS.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostApplicationSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<PriorityClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_path: Option<CgroupPath>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<HostApplicationStrategy>,
}

/// Host application strategy: empty in the reference.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct HostApplicationStrategy {}

/// Where a host application's cgroup lives.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CgroupPath {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<CgroupBaseType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_path: Option<String>,
}

wire_enum! {
    /// `cpuSuppressPolicy`.
    pub enum CpuSuppressPolicy {
        CpuSet => "cpuset",
        CfsQuota => "cfsQuota",
    }
}

wire_enum! {
    /// `cpuEvictPolicy`.
    pub enum CpuEvictPolicy {
        EvictByRealLimit => "evictByRealLimit",
        EvictByAllocatable => "evictByAllocatable",
    }
}

wire_enum! {
    /// `cpuBurstStrategy.policy`.
    pub enum CpuBurstPolicy {
        None => "none",
        CpuBurstOnly => "cpuBurstOnly",
        CfsQuotaBurstOnly => "cfsQuotaBurstOnly",
        Auto => "auto",
    }
}

wire_enum! {
    /// `policies.cpuPolicy`.
    pub enum CpuQosPolicy {
        GroupIdentity => "groupIdentity",
        CoreSched => "coreSched",
    }
}

wire_enum! {
    /// `policies.netQOSPolicy`.
    pub enum NetQosPolicy {
        Tc => "tc",
        TerwayQos => "terway-qos",
    }
}

wire_enum! {
    /// `blocks[].type`.
    pub enum BlockType {
        Device => "device",
        VolumeGroup => "volumegroup",
        PodVolume => "podvolume",
    }
}

wire_enum! {
    /// Koordinator QoS class of a host application.
    pub enum QosClass {
        Lse => "LSE",
        Lsr => "LSR",
        Ls => "LS",
        Be => "BE",
        System => "SYSTEM",
    }
}

wire_enum! {
    /// Koordinator priority class of a host application.
    pub enum PriorityClass {
        Prod => "koord-prod",
        Mid => "koord-mid",
        Batch => "koord-batch",
        Free => "koord-free",
    }
}

wire_enum! {
    /// `cgroupPath.base`.
    pub enum CgroupBaseType {
        CgroupRoot => "CgroupRoot",
        Kubepods => "Kubepods",
        KubepodsBurstable => "KubepodsBurstable",
        KubepodsBesteffort => "KubepodsBesteffort",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    // The JSON shapes of the spec's acceptance examples: these tests check decoding and
    // round-tripping only; the acceptance behaviour (defaults, merge, node strategies) is
    // tested in `nodeslo-core` and the controller's end-to-end suite.

    /// Decodes a spec, checks it serialises back to the same JSON, and returns it.
    fn spec_round_trip(input: Value) -> NodeSloSpec {
        let spec: NodeSloSpec = serde_json::from_value(input.clone()).expect("example decodes");
        assert_eq!(serde_json::to_value(&spec).expect("serialises"), input);
        spec
    }

    fn threshold_default() -> Value {
        json!({"enable": false, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": "cpuset",
               "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"})
    }

    fn burst_default() -> Value {
        json!({"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
               "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 50})
    }

    #[test]
    fn default_spec_json_round_trips_into_typed_enums() {
        let spec = spec_round_trip(json!({
            "resourceUsedThresholdWithBE": threshold_default(),
            "resourceQOSStrategy": {},
            "cpuBurstStrategy": burst_default(),
            "systemStrategy": {"totalNetworkBandwidth": "0"}
        }));
        let threshold = spec.resource_used_threshold_with_be.expect("threshold set");
        assert_eq!(
            threshold.cpu_suppress_policy,
            Some(CpuSuppressPolicy::CpuSet)
        );
        assert_eq!(
            threshold.cpu_evict_policy,
            Some(CpuEvictPolicy::EvictByRealLimit)
        );
        assert_eq!(
            spec.resource_qos_strategy,
            Some(ResourceQosStrategy::default())
        );
        assert_eq!(
            spec.cpu_burst_strategy.and_then(|b| b.policy),
            Some(CpuBurstPolicy::None)
        );
        assert!(spec.host_applications.is_none());
    }

    #[test]
    fn merged_spec_json_round_trips_nested_fields() {
        let spec = spec_round_trip(json!({
            "resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 60, "cpuSuppressPolicy": "cpuset",
                                            "memoryEvictThresholdPercent": 70, "cpuEvictPolicy": "evictByRealLimit"},
            "resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 0}}},
            "cpuBurstStrategy": {"policy": "none", "cpuBurstPercent": 1000, "cfsQuotaBurstPercent": 300,
                                 "cfsQuotaBurstPeriodSeconds": 60, "sharePoolThresholdPercent": 50},
            "systemStrategy": {"minFreeKbytesFactor": 150, "watermarkScaleFactor": 150,
                               "schedFeatures": {"ID_ABSOLUTE_EXPEL": true, "ID_EXPELLER_SHARE_CORE": false},
                               "totalNetworkBandwidth": "0"},
            "hostApplications": [{"name": "test-app"}]
        }));
        let be = spec
            .resource_qos_strategy
            .and_then(|q| q.be_class)
            .and_then(|c| c.cpu_qos);
        assert_eq!(be.and_then(|c| c.group_identity), Some(0));
        let system = spec.system_strategy.expect("system set");
        assert_eq!(
            system
                .sched_features
                .and_then(|f| f.get("ID_EXPELLER_SHARE_CORE").copied()),
            Some(false)
        );
        assert_eq!(system.total_network_bandwidth, Some(Quantity("0".into())));
    }

    #[test]
    fn threshold_percents_and_bandwidth_quantities_round_trip() {
        for percent in [40, 50, 60] {
            let mut threshold = threshold_default();
            threshold["enable"] = json!(true);
            threshold["cpuSuppressThresholdPercent"] = json!(percent);
            let spec = spec_round_trip(json!({"resourceUsedThresholdWithBE": threshold}));
            assert_eq!(
                spec.resource_used_threshold_with_be
                    .and_then(|t| t.cpu_suppress_threshold_percent),
                Some(percent)
            );
        }
        let spec = spec_round_trip(
            json!({"systemStrategy": {"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "99M"}}),
        );
        assert_eq!(
            spec.system_strategy.and_then(|s| s.total_network_bandwidth),
            Some(Quantity("99M".into()))
        );
    }

    #[test]
    fn host_applications_round_trip_with_their_qos_class() {
        let spec =
            spec_round_trip(json!({"hostApplications": [{"name": "test-app-ls", "qos": "LS"}]}));
        assert_eq!(
            spec.host_applications
                .as_deref()
                .and_then(|a| a[0].qos.clone()),
            Some(QosClass::Ls)
        );
        let spec =
            spec_round_trip(json!({"hostApplications": [{"name": "test-app-lsr", "qos": "LSR"}]}));
        assert_eq!(
            spec.host_applications
                .as_deref()
                .and_then(|a| a[0].qos.clone()),
            Some(QosClass::Lsr)
        );
        spec_round_trip(json!({"hostApplications": [{"name": "test-app-default"}]}));
    }

    /// Every field of the spec, with its exact JSON name.
    fn full_spec() -> Value {
        let class = json!({
            "cpuQOS": {"enable": true, "groupIdentity": -1, "schedIdle": 1, "coreExpeller": true},
            "memoryQOS": {"enable": true, "minLimitPercent": 10, "lowLimitPercent": 20, "throttlingPercent": 80,
                          "wmarkRatio": 95, "wmarkScalePermill": 20, "wmarkMinAdj": -25, "priorityEnable": 1,
                          "priority": 12, "oomKillGroup": 0, "pageCacheEnable": true, "pageCacheLimitPercent": 50,
                          "pageCacheLimitSize": 1024, "pageCacheReclaimSync": false},
            "blkioQOS": {"enable": true, "blocks": [
                {"name": "/dev/sdb", "type": "device", "ioCfg": {
                    "readIOPS": 1, "writeIOPS": 2, "readBPS": 3, "writeBPS": 4, "ioWeightPercent": 100,
                    "readLatency": 5, "writeLatency": 6, "readLatencyPercent": 95, "writeLatencyPercent": 95,
                    "enableUserModel": true, "modelReadBPS": 7, "modelWriteBPS": 8, "modelReadSeqIOPS": 9,
                    "modelWriteSeqIOPS": 10, "modelReadRandIOPS": 11, "modelWriteRandIOPS": 12}},
                {"name": "vg0", "type": "volumegroup"},
                {"name": "pvc", "type": "podvolume", "ioCfg": {}}
            ]},
            "resctrlQOS": {"enable": true, "catRangeStartPercent": 0, "catRangeEndPercent": 100, "mbaPercent": 100},
            "networkQOS": {"enable": true, "ingressRequest": 0, "ingressLimit": "50M", "egressRequest": "0", "egressLimit": 100}
        });
        json!({
            "resourceUsedThresholdWithBE": {
                "enable": true, "cpuSuppressThresholdPercent": 65, "cpuSuppressMinPercent": 10,
                "cpuSuppressPolicy": "cfsQuota", "memoryEvictThresholdPercent": 70, "memoryEvictLowerPercent": 68,
                "cpuEvictBESatisfactionUpperPercent": 80, "cpuEvictBESatisfactionLowerPercent": 60,
                "cpuEvictBEUsageThresholdPercent": 90, "cpuEvictTimeWindowSeconds": 300,
                "cpuEvictThresholdPercent": 85, "cpuEvictLowerPercent": 83, "cpuEvictPolicy": "evictByAllocatable",
                "memoryAllocatableEvictThresholdPercent": 110, "memoryAllocatableEvictLowerPercent": 100,
                "cpuAllocatableEvictThresholdPercent": 110, "cpuAllocatableEvictLowerPercent": 100,
                "evictEnabledPriorityThreshold": 5999, "allocatableEvictPriorityThreshold": 5999
            },
            "resourceQOSStrategy": {
                "policies": {"cpuPolicy": "coreSched", "netQOSPolicy": "terway-qos"},
                "lsrClass": class.clone(), "lsClass": class.clone(), "beClass": class.clone(),
                "systemClass": class.clone(), "cgroupRoot": class
            },
            "cpuBurstStrategy": {"policy": "auto", "cpuBurstPercent": 10000, "cfsQuotaBurstPercent": 300,
                                 "cfsQuotaBurstPeriodSeconds": -1, "sharePoolThresholdPercent": 100},
            "systemStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 400, "memcgReapBackGround": 1,
                               "schedGroupIdentityEnabled": 1, "schedIdleSaverWmark": 5000000,
                               "schedFeatures": {"ID_ABSOLUTE_EXPEL": true}, "pageCacheLimitEnabled": 0,
                               "totalNetworkBandwidth": "10G"},
            "extensions": {"vendor.io/x": {"nested": [1, {"deep": null}], "unknownShape": true}},
            "hostApplications": [{
                "name": "nginx", "priority": "koord-prod", "qos": "LSE",
                "cgroupPath": {"base": "KubepodsBurstable", "parentDir": "host-latency-sensitive/", "relativePath": "nginx/"},
                "strategy": {}
            }]
        })
    }

    #[test]
    fn every_field_round_trips_with_exact_names() {
        let spec = spec_round_trip(full_spec());
        let qos = spec.resource_qos_strategy.expect("qos set");
        assert_eq!(
            qos.policies.and_then(|p| p.net_qos_policy),
            Some(NetQosPolicy::TerwayQos)
        );
        let ls = qos.ls_class.expect("ls set");
        let blocks = ls.blkio_qos.and_then(|b| b.blocks).expect("blocks set");
        assert_eq!(blocks[1].block_type, Some(BlockType::VolumeGroup));
        let net = ls.network_qos.expect("network set");
        assert_eq!(net.ingress_limit, Some(IntOrString::String("50M".into())));
        assert_eq!(net.egress_limit, Some(IntOrString::Int(100)));
        let app = &spec.host_applications.expect("apps set")[0];
        assert_eq!(app.priority, Some(PriorityClass::Prod));
        assert_eq!(
            app.cgroup_path.as_ref().and_then(|c| c.base.clone()),
            Some(CgroupBaseType::KubepodsBurstable)
        );
    }

    #[test]
    fn whole_object_round_trips_with_empty_status() {
        let input = json!({
            "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO",
            "metadata": {"name": "node-1", "resourceVersion": "7"},
            "spec": full_spec(),
            "status": {}
        });
        let slo: NodeSlo = serde_json::from_value(input.clone()).expect("decodes");
        assert_eq!(slo.status, Some(NodeSloStatus {}));
        assert_eq!(serde_json::to_value(&slo).expect("serialises"), input);
    }

    #[test]
    fn unknown_fields_are_dropped_except_in_extensions() {
        let spec: NodeSloSpec = serde_json::from_value(json!({
            "systemStrategy": {"minFreeKbytesFactor": 1, "futureKnob": 3},
            "futureStrategy": {"a": 1},
            "extensions": {"futureKnob": 3}
        }))
        .expect("lenient");
        assert_eq!(
            serde_json::to_value(&spec).expect("serialises"),
            json!({"systemStrategy": {"minFreeKbytesFactor": 1}, "extensions": {"futureKnob": 3}})
        );
    }

    #[test]
    fn unknown_enum_strings_do_not_fail_the_object() {
        let spec = spec_round_trip(json!({
            "resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cpuShare", "cpuEvictPolicy": "evictBySomething"},
            "cpuBurstStrategy": {"policy": "turbo"},
            "hostApplications": [{"qos": "GUARANTEED", "priority": "koord-ultra", "cgroupPath": {"base": "Elsewhere"}}]
        }));
        assert_eq!(
            spec.resource_used_threshold_with_be
                .and_then(|t| t.cpu_suppress_policy),
            Some(CpuSuppressPolicy::Other("cpuShare".into()))
        );
    }

    #[test]
    fn enum_strings_are_exact() {
        fn strings<T: Clone + ToString>(all: &[T]) -> Vec<String> {
            all.iter().map(ToString::to_string).collect()
        }
        assert_eq!(strings(CpuSuppressPolicy::KNOWN), ["cpuset", "cfsQuota"]);
        assert_eq!(
            strings(CpuEvictPolicy::KNOWN),
            ["evictByRealLimit", "evictByAllocatable"]
        );
        assert_eq!(
            strings(CpuBurstPolicy::KNOWN),
            ["none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto"]
        );
        assert_eq!(strings(CpuQosPolicy::KNOWN), ["groupIdentity", "coreSched"]);
        assert_eq!(strings(NetQosPolicy::KNOWN), ["tc", "terway-qos"]);
        assert_eq!(
            strings(BlockType::KNOWN),
            ["device", "volumegroup", "podvolume"]
        );
        assert_eq!(
            strings(QosClass::KNOWN),
            ["LSE", "LSR", "LS", "BE", "SYSTEM"]
        );
        assert_eq!(
            strings(PriorityClass::KNOWN),
            ["koord-prod", "koord-mid", "koord-batch", "koord-free"]
        );
        assert_eq!(
            strings(CgroupBaseType::KNOWN),
            [
                "CgroupRoot",
                "Kubepods",
                "KubepodsBurstable",
                "KubepodsBesteffort"
            ]
        );
    }
}
