//! The Job controller: up to `parallelism` Pods at a time until `completions` have Succeeded
//! (then the SuccessCriteriaMet and Complete conditions and `completionTime`, as 1.33 writes
//! them), or more than `backoffLimit` have Failed (FailureTarget, the active pods deleted, then
//! Failed). Pods that really run (`--exec-images`) succeed or fail by their exit code; simulated
//! ones succeed one pass after they run (see `pod`).

use super::{
    PassReport, WorkloadError, all, controller_uid, deleting, name, namespace, opts, pod_ready,
    uid, write_err,
};
use crate::cluster::{Cluster, DeleteOptions, Sub};
use crate::registry::ResourceInfo;
use crate::util;
use serde_json::{Value, json};
use std::sync::Arc;

const MANAGER: &str = "kube-controller-manager";
const COMPLETIONS_REACHED: (&str, &str) = (
    "CompletionsReached",
    "Reached expected number of succeeded pods",
);
const BACKOFF_LIMIT_EXCEEDED: (&str, &str) = (
    "BackoffLimitExceeded",
    "Job has reached the specified backoff limit",
);

/// Whether a simulated pod of this owner runs to completion (a Job's) rather than forever.
pub(super) fn runs_to_completion(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["controller"] == json!(true) && r["kind"] == "Job")
}

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

fn has_condition(job: &Value, kind: &str) -> bool {
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

fn finished(job: &Value) -> bool {
    has_condition(job, "Complete") || has_condition(job, "Failed")
}

fn condition(kind: &str, (reason, message): (&str, &str), now: &str) -> Value {
    json!({"type": kind, "status": "True", "reason": reason, "message": message,
           "lastProbeTime": now, "lastTransitionTime": now})
}

/// Jobs -> Pods and status.
pub(super) fn sync(
    cluster: &mut Cluster,
    jobs: &ResourceInfo,
    pods_info: &ResourceInfo,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let pods = all(cluster, pods_info);
    for job in all(cluster, jobs) {
        if deleting(&job) || finished(&job) {
            continue;
        }
        let owned: Vec<&Arc<Value>> = pods
            .iter()
            .filter(|p| controller_uid(p) == Some(uid(&job)))
            .collect();
        let count = |want: &str| owned.iter().filter(|p| phase(p) == want).count() as i64;
        let (succeeded, failed) = (count("Succeeded"), count("Failed"));
        let active: Vec<&&Arc<Value>> = owned
            .iter()
            .filter(|p| !deleting(p) && !matches!(phase(p), "Succeeded" | "Failed"))
            .collect();
        let terminating = owned.iter().filter(|p| deleting(p)).count() as i64;
        let spec = &job["spec"];
        let completions = spec["completions"].as_i64().unwrap_or(1).max(0);
        let parallelism = spec["parallelism"].as_i64().unwrap_or(1).max(0);
        let backoff_limit = spec["backoffLimit"].as_i64().unwrap_or(6).max(0);
        let suspended = spec["suspend"] == json!(true);
        let now = util::now_rfc3339();
        let mut status = job["status"].clone();
        if !status.is_object() {
            status = json!({});
        }
        let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        let has = |conditions: &[Value], kind: &str| {
            conditions
                .iter()
                .any(|c| c["type"] == kind && c["status"] == "True")
        };
        let mut active_now = active.len() as i64;
        if failed > backoff_limit && !has(&conditions, "FailureTarget") {
            conditions.push(condition("FailureTarget", BACKOFF_LIMIT_EXCEEDED, &now));
        }
        if succeeded >= completions && !has(&conditions, "SuccessCriteriaMet") {
            conditions.push(condition("SuccessCriteriaMet", COMPLETIONS_REACHED, &now));
        }
        let ending = has(&conditions, "FailureTarget") || has(&conditions, "SuccessCriteriaMet");
        if ending {
            // Whatever still runs is stopped.
            for p in &active {
                cluster
                    .delete(pods_info, namespace(p), name(p), &DeleteOptions::default())
                    .map_err(|e| write_err("a Job Pod", &e))?;
                report.writes += 1;
            }
            active_now = 0;
            if terminating == 0 {
                if has(&conditions, "FailureTarget") {
                    conditions.push(condition("Failed", BACKOFF_LIMIT_EXCEEDED, &now));
                } else {
                    conditions.push(condition("Complete", COMPLETIONS_REACHED, &now));
                    status["completionTime"] = json!(now);
                }
            }
        } else if !suspended {
            let want = parallelism.min(completions - succeeded);
            while active_now < want {
                cluster
                    .create(
                        pods_info,
                        namespace(&job),
                        super::replicaset::desired_pod_of(&job, "batch/v1", "Job"),
                        &opts(MANAGER),
                    )
                    .map_err(|e| write_err("a Job Pod", &e))?;
                report.writes += 1;
                active_now += 1;
            }
        }
        if status["startTime"].is_null() && !suspended {
            status["startTime"] = json!(now);
        }
        let ready = active.iter().filter(|p| pod_ready(p)).count() as i64;
        if let Some(object) = status.as_object_mut() {
            for (k, v) in [
                ("active", active_now),
                ("succeeded", succeeded),
                ("failed", failed),
            ] {
                // Counts Go omits when zero.
                if v == 0 {
                    object.remove(k);
                } else {
                    object.insert(k.into(), json!(v));
                }
            }
            object.insert("ready".into(), json!(ready));
            object.insert("terminating".into(), json!(terminating));
            object.insert("uncountedTerminatedPods".into(), json!({}));
            if conditions.is_empty() {
                object.remove("conditions");
            } else {
                object.insert("conditions".into(), json!(conditions));
            }
        }
        if job["status"] != status {
            let mut updated = (*job).clone();
            updated["status"] = status;
            cluster
                .update(
                    jobs,
                    namespace(&job),
                    name(&job),
                    updated,
                    Sub::Status,
                    &opts(MANAGER),
                )
                .map_err(|e| write_err("a Job status", &e))?;
            report.writes += 1;
        }
    }
    Ok(())
}

/// The status of a simulated Job pod that ran to completion (exit code 0).
pub(super) fn succeeded_status(pod: &Value) -> Value {
    let mut status = pod["status"].clone();
    let now = util::now_rfc3339();
    let started = status["startTime"].clone();
    status["phase"] = json!("Succeeded");
    if let Some(conditions) = status["conditions"].as_array_mut() {
        for c in conditions {
            if matches!(c["type"].as_str(), Some("Ready" | "ContainersReady")) {
                c["status"] = json!("False");
                c["reason"] = json!("PodCompleted");
                c["lastTransitionTime"] = json!(now);
            }
        }
    }
    if let Some(containers) = status["containerStatuses"].as_array_mut() {
        for c in containers {
            c["ready"] = json!(false);
            c["started"] = json!(false);
            c["state"] = json!({"terminated": {"exitCode": 0, "reason": "Completed",
                "startedAt": started, "finishedAt": now}});
        }
    }
    status
}
