//! The Job controller: up to `parallelism` Pods at a time until `completions` have Succeeded
//! (then the SuccessCriteriaMet and Complete conditions and `completionTime`, as 1.33 writes
//! them), or more than `backoffLimit` have Failed (FailureTarget, the active pods deleted, then
//! Failed). With `completionMode: Indexed` each pod carries its completion index (annotation,
//! label, `JOB_COMPLETION_INDEX`, hostname `<job>-<index>`) and the Job completes when every index
//! has succeeded once (`status.completedIndexes`). Pods that really run (`--exec-images`) succeed
//! or fail by their exit code; simulated ones succeed one pass after they run (see `pod`).
//! `podFailurePolicy` rules decide whether a failed pod counts, is ignored, or fails the Job.

use super::{
    PassReport, WorkloadError, all, controller_uid, deleting, name, namespace, opts, pod_ready,
    uid, write_err,
};
use super::{condition_true, has_condition, write_status};
use crate::cluster::{Cluster, DeleteOptions};
use crate::registry::ResourceInfo;
use crate::util;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

const MANAGER: &str = "kube-controller-manager";
/// Where an Indexed Job's pod carries its index (annotation and label, as 1.33 sets both).
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
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
        let active: Vec<&&Arc<Value>> = owned
            .iter()
            .filter(|p| !deleting(p) && !matches!(phase(p), "Succeeded" | "Failed"))
            .collect();
        let terminating = owned.iter().filter(|p| deleting(p)).count() as i64;
        let spec = &job["spec"];
        let completions = spec["completions"].as_i64().unwrap_or(1).max(0);
        let indexed = spec["completionMode"] == "Indexed";
        // Indexed: an index counts once, however many of its pods succeeded.
        let succeeded_indexes: BTreeSet<i64> = owned
            .iter()
            .filter(|p| phase(p) == "Succeeded")
            .filter_map(|p| completion_index(p))
            .filter(|i| (0..completions).contains(i))
            .collect();
        let succeeded = if indexed {
            succeeded_indexes.len() as i64
        } else {
            count("Succeeded")
        };
        // `podFailurePolicy`: the first rule a failed pod matches decides whether it counts
        // towards `backoffLimit` (Count), not at all (Ignore), or fails the Job (FailJob).
        let mut failed = 0;
        let mut fail_job: Option<String> = None;
        for pod in owned.iter().filter(|p| phase(p) == "Failed") {
            match failure_policy_verdict(&job["spec"]["podFailurePolicy"], pod) {
                Verdict::Count => failed += 1,
                Verdict::Ignore => {}
                Verdict::FailJob(message) => {
                    failed += 1;
                    fail_job.get_or_insert(message);
                }
            }
        }
        let parallelism = spec["parallelism"].as_i64().unwrap_or(1).max(0);
        let backoff_limit = spec["backoffLimit"].as_i64().unwrap_or(6).max(0);
        let suspended = spec["suspend"] == json!(true);
        let now = util::now_rfc3339();
        let mut status = job["status"].clone();
        if !status.is_object() {
            status = json!({});
        }
        let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
        let mut active_now = active.len() as i64;
        if !condition_true(&conditions, "FailureTarget") {
            if let Some(message) = &fail_job {
                conditions.push(condition(
                    "FailureTarget",
                    (POD_FAILURE_POLICY, message),
                    &now,
                ));
            } else if failed > backoff_limit {
                conditions.push(condition("FailureTarget", BACKOFF_LIMIT_EXCEEDED, &now));
            }
        }
        if succeeded >= completions && !condition_true(&conditions, "SuccessCriteriaMet") {
            conditions.push(condition("SuccessCriteriaMet", COMPLETIONS_REACHED, &now));
        }
        let ending = condition_true(&conditions, "FailureTarget")
            || condition_true(&conditions, "SuccessCriteriaMet");
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
                if let Some(target) = conditions
                    .iter()
                    .find(|c| c["type"] == "FailureTarget" && c["status"] == "True")
                {
                    // Failed carries the reason and message its FailureTarget gave.
                    let why = (
                        target["reason"].as_str().unwrap_or_default().to_owned(),
                        target["message"].as_str().unwrap_or_default().to_owned(),
                    );
                    conditions.push(condition("Failed", (&why.0, &why.1), &now));
                } else {
                    conditions.push(condition("Complete", COMPLETIONS_REACHED, &now));
                    status["completionTime"] = json!(now);
                }
            }
        } else if !suspended {
            let want = parallelism.min(completions - succeeded);
            // Indexed: the lowest indexes neither succeeded nor running, as upstream picks them.
            let running: BTreeSet<i64> =
                active.iter().filter_map(|p| completion_index(p)).collect();
            let mut pending =
                (0..completions).filter(|i| !succeeded_indexes.contains(i) && !running.contains(i));
            while active_now < want {
                let mut pod = super::replicaset::desired_pod_of(&job, "batch/v1", "Job");
                if indexed {
                    let Some(index) = pending.next() else { break };
                    with_completion_index(&mut pod, name(&job), index);
                }
                cluster
                    .create(pods_info, namespace(&job), pod, &opts(MANAGER))
                    .map_err(|e| write_err("a Job Pod", &e))?;
                report.writes += 1;
                active_now += 1;
            }
        }
        if indexed && !succeeded_indexes.is_empty() {
            status["completedIndexes"] = json!(index_ranges(&succeeded_indexes));
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
        write_status(cluster, jobs, &job, status, MANAGER, report)?;
    }
    Ok(())
}

/// The reason of a Job failed by a `podFailurePolicy` FailJob rule.
const POD_FAILURE_POLICY: &str = "PodFailurePolicy";

/// What a failed pod means for its Job under `podFailurePolicy`.
#[derive(Debug, PartialEq)]
enum Verdict {
    Count,
    Ignore,
    /// The message upstream writes on the FailureTarget and Failed conditions.
    FailJob(String),
}

/// The first `podFailurePolicy` rule `pod` matches (upstream's `matchPodFailurePolicy`): by a
/// non-zero exit code of an init or app container (`onExitCodes`, `In`/`NotIn`, optionally one
/// container), or by a pod condition (`onPodConditions`). No rule matched: Count.
fn failure_policy_verdict(policy: &Value, pod: &Value) -> Verdict {
    let ns_name = format!("{}/{}", namespace(pod), name(pod));
    for (index, rule) in policy["rules"].as_array().into_iter().flatten().enumerate() {
        let action = rule["action"].as_str().unwrap_or_default();
        let matched = if rule["onExitCodes"].is_object() {
            matching_exit(pod, &rule["onExitCodes"]).map(|(container, code)| {
                format!(
                    "Container {container} for pod {ns_name} failed with exit code {code} \
                     matching {action} rule at index {index}"
                )
            })
        } else {
            matching_condition(pod, &rule["onPodConditions"]).map(|kind| {
                format!(
                    "Pod {ns_name} has condition {kind} matching {action} rule at index {index}"
                )
            })
        };
        let Some(message) = matched else { continue };
        return match action {
            "Ignore" => Verdict::Ignore,
            "FailJob" => Verdict::FailJob(message),
            // Count, and FailIndex (no per-index backoff limit here) count as a failure.
            _ => Verdict::Count,
        };
    }
    Verdict::Count
}

/// The first terminated container (init containers first) with a non-zero exit code the
/// requirement matches: (its name, the code).
fn matching_exit(pod: &Value, requirement: &Value) -> Option<(String, i64)> {
    let values: Vec<i64> = requirement["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .collect();
    let only = requirement["containerName"].as_str();
    ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|list| pod["status"][list].as_array().into_iter().flatten())
        .filter(|c| only.is_none_or(|n| c["name"] == n))
        .find_map(|c| {
            let code = c["state"]["terminated"]["exitCode"].as_i64()?;
            let listed = values.contains(&code);
            let hit = match requirement["operator"].as_str() {
                Some("In") => listed,
                Some("NotIn") => !listed,
                _ => false,
            };
            (code != 0 && hit).then(|| (c["name"].as_str().unwrap_or_default().to_owned(), code))
        })
}

/// The first of `patterns` (`type`, `status`, default "True") the pod's conditions match.
fn matching_condition(pod: &Value, patterns: &Value) -> Option<String> {
    let conditions = pod["status"]["conditions"].as_array()?;
    patterns.as_array()?.iter().find_map(|p| {
        let kind = p["type"].as_str()?;
        let status = p["status"].as_str().unwrap_or("True");
        conditions
            .iter()
            .any(|c| c["type"] == kind && c["status"] == status)
            .then(|| kind.to_owned())
    })
}

/// An Indexed Job pod's completion index (its annotation).
fn completion_index(pod: &Value) -> Option<i64> {
    pod["metadata"]["annotations"][COMPLETION_INDEX]
        .as_str()?
        .parse()
        .ok()
}

/// Makes `pod` the pod of `index` of Indexed Job `job`, as the Job controller does: name prefix
/// and hostname `<job>-<index>`, the index as annotation and label, and `JOB_COMPLETION_INDEX`
/// (read from the annotation) in every container that does not set it.
fn with_completion_index(pod: &mut Value, job: &str, index: i64) {
    let metadata = &mut pod["metadata"];
    metadata["generateName"] = json!(format!("{job}-{index}-"));
    for map in ["annotations", "labels"] {
        if !metadata[map].is_object() {
            metadata[map] = json!({});
        }
        metadata[map][COMPLETION_INDEX] = json!(index.to_string());
    }
    let spec = &mut pod["spec"];
    if spec["hostname"].is_null() {
        spec["hostname"] = json!(format!("{job}-{index}"));
    }
    let env_var = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef":
        {"fieldPath": format!("metadata.annotations['{COMPLETION_INDEX}']")}}});
    for list in ["initContainers", "containers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            if !container["env"].is_array() {
                container["env"] = json!([]);
            }
            let env = container["env"].as_array_mut().expect("set above");
            if !env.iter().any(|e| e["name"] == "JOB_COMPLETION_INDEX") {
                env.push(env_var.clone());
            }
        }
    }
}

/// `status.completedIndexes`: sorted indexes as intervals, "0-2,5,7-8".
fn index_ranges(indexes: &BTreeSet<i64>) -> String {
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for &i in indexes {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == i => *end = i,
            _ => ranges.push((i, i)),
        }
    }
    ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_failure_policy_takes_the_first_matching_rule_as_upstream() {
        let policy = json!({"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [3]}},
            {"action": "Ignore", "onExitCodes": {"operator": "NotIn", "values": [1, 3]}}]});
        let pod = |code: i64, conditions: Value| {
            json!({"metadata": {"name": "p", "namespace": "ns"}, "status": {"phase": "Failed",
                "conditions": conditions,
                "containerStatuses": [
                    {"name": "side", "state": {"terminated": {"exitCode": 0}}},
                    {"name": "main", "state": {"terminated": {"exitCode": code}}}]}})
        };
        assert_eq!(
            failure_policy_verdict(&policy, &pod(3, json!([]))),
            Verdict::FailJob(
                "Container main for pod ns/p failed with exit code 3 matching FailJob rule at index 1"
                    .into()
            )
        );
        assert_eq!(
            failure_policy_verdict(&policy, &pod(1, json!([]))),
            Verdict::Count
        );
        assert_eq!(
            failure_policy_verdict(&policy, &pod(42, json!([]))),
            Verdict::Ignore
        );
        let disrupted = json!([{"type": "DisruptionTarget", "status": "True"}]);
        assert_eq!(
            failure_policy_verdict(&policy, &pod(3, disrupted)),
            Verdict::Ignore
        );
        assert_eq!(
            failure_policy_verdict(&Value::Null, &pod(3, json!([]))),
            Verdict::Count
        );
    }

    #[test]
    fn completed_indexes_are_written_as_intervals() {
        let set = |v: &[i64]| v.iter().copied().collect::<BTreeSet<i64>>();
        assert_eq!(index_ranges(&set(&[0, 1, 2, 5, 7, 8])), "0-2,5,7-8");
        assert_eq!(index_ranges(&set(&[3])), "3");
        assert_eq!(index_ranges(&set(&[])), "");
    }

    #[test]
    fn an_indexed_pod_carries_its_index_everywhere_upstream_puts_it() {
        let mut pod = json!({"metadata": {"generateName": "work-"}, "spec": {"containers": [
            {"name": "a"}, {"name": "b", "env": [{"name": "JOB_COMPLETION_INDEX", "value": "mine"}]}]}});
        with_completion_index(&mut pod, "work", 4);
        assert_eq!(pod["metadata"]["generateName"], "work-4-");
        assert_eq!(pod["metadata"]["annotations"][COMPLETION_INDEX], "4");
        assert_eq!(pod["metadata"]["labels"][COMPLETION_INDEX], "4");
        assert_eq!(pod["spec"]["hostname"], "work-4");
        assert_eq!(
            pod["spec"]["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        // A container that sets the variable itself keeps its own.
        assert_eq!(
            pod["spec"]["containers"][1]["env"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(completion_index(&pod), Some(4));
    }
}
