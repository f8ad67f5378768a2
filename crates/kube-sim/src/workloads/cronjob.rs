//! The CronJob controller, as upstream's `cronjob_controllerv2` acts: at the most recent time the
//! schedule (5 fields, `@hourly` and friends, in `spec.timeZone` or UTC) names since the last run,
//! a Job `<cronjob>-<minutes since the epoch>` from `jobTemplate`, unless the CronJob is
//! suspended, past `startingDeadlineSeconds`, or `concurrencyPolicy` says otherwise (`Forbid`
//! skips while one runs, `Replace` deletes the running ones first). Status keeps `active`,
//! `lastScheduleTime` and `lastSuccessfulTime`; finished Jobs beyond the history limits go.
//! Missed runs are not caught up one by one: only the most recent runs, as upstream does.

use super::{PassReport, WorkloadError, all, controller_uid, deleting, name, namespace, opts, uid};
use super::{has_condition, write_status};
use crate::cluster::{Cluster, DeleteOptions};
use crate::registry::ResourceInfo;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};
use serde_json::{Value, json};
use std::sync::Arc;

const MANAGER: &str = "kube-controller-manager";
/// The annotation upstream puts on each Job with the time it was scheduled for.
const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// A CronJob's schedule: Kubernetes' 5-field cron (no seconds, no year), day-of-month and
/// day-of-week OR-ed as Vixie cron does, in its time zone.
pub(super) struct Schedule {
    cron: Cron,
    zone: TimeZone,
}

impl Schedule {
    pub(super) fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Self, String> {
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(schedule)
            .map_err(|e| format!("unparseable schedule {schedule:?}: {e}"))?;
        let zone = match time_zone {
            None | Some("") => TimeZone::UTC,
            Some(name) => {
                TimeZone::get(name).map_err(|e| format!("unknown time zone {name:?}: {e}"))?
            }
        };
        Ok(Self { cron, zone })
    }

    /// The latest scheduled time in `(after, now]`, if any.
    pub(super) fn most_recent(&self, after: Timestamp, now: Timestamp) -> Option<Zoned> {
        let previous = self
            .cron
            .find_previous_occurrence(&now.to_zoned(self.zone.clone()), true)
            .ok()?;
        (previous.timestamp() > after).then_some(previous)
    }

    /// The first scheduled time after `now`.
    pub(super) fn next(&self, now: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_next_occurrence(&now.to_zoned(self.zone.clone()), false)
            .ok()
            .map(|z| z.timestamp())
    }
}

fn timestamp(value: &Value) -> Option<Timestamp> {
    value.as_str()?.parse().ok()
}

/// RFC 3339 with seconds, as `metav1.Time` is written.
fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn job_finished(job: &Value) -> Option<&'static str> {
    ["Complete", "Failed"]
        .into_iter()
        .find(|kind| has_condition(job, kind))
}

/// CronJobs -> Jobs and status; returns the earliest time a schedule next fires, so the
/// simulation wakes then.
pub(super) fn sync(
    cluster: &mut Cluster,
    cronjobs: &ResourceInfo,
    jobs_info: &ResourceInfo,
    report: &mut PassReport,
) -> Result<Option<Timestamp>, WorkloadError> {
    let jobs = all(cluster, jobs_info);
    let now = Timestamp::now();
    let mut wake: Option<Timestamp> = None;
    for cronjob in all(cluster, cronjobs) {
        if deleting(&cronjob) {
            continue;
        }
        let spec = &cronjob["spec"];
        let mut owned: Vec<&Arc<Value>> = jobs
            .iter()
            .filter(|j| controller_uid(j) == Some(uid(&cronjob)) && !deleting(j))
            .collect();
        owned.sort_by_key(|j| {
            (
                j["metadata"]["creationTimestamp"]
                    .as_str()
                    .map(String::from),
                name(j).to_owned(),
            )
        });
        let mut status = cronjob["status"].clone();
        if !status.is_object() {
            status = json!({});
        }

        // Finished Jobs beyond the history limits go, oldest first.
        for (kind, limit) in [
            (
                "Complete",
                spec["successfulJobsHistoryLimit"].as_i64().unwrap_or(3),
            ),
            (
                "Failed",
                spec["failedJobsHistoryLimit"].as_i64().unwrap_or(1),
            ),
        ] {
            let finished: Vec<&&Arc<Value>> = owned
                .iter()
                .filter(|j| job_finished(j) == Some(kind))
                .collect();
            let excess = finished.len().saturating_sub(limit.max(0) as usize);
            for job in &finished[..excess] {
                delete_job(cluster, jobs_info, job, report)?;
            }
        }
        if let Some(last) = owned
            .iter()
            .filter(|j| job_finished(j) == Some("Complete"))
            .filter_map(|j| timestamp(&j["status"]["completionTime"]))
            .max()
        {
            status["lastSuccessfulTime"] = json!(rfc3339(last));
        }
        let mut active: Vec<Arc<Value>> = owned
            .iter()
            .filter(|j| job_finished(j).is_none())
            .map(|j| Arc::clone(j))
            .collect();

        let schedule = match Schedule::parse(
            spec["schedule"].as_str().unwrap_or_default(),
            spec["timeZone"].as_str(),
        ) {
            Ok(schedule) => Some(schedule),
            Err(why) => {
                tracing::warn!(cronjob = name(&cronjob), %why, "CronJob not scheduled");
                None
            }
        };
        if let Some(schedule) = schedule.filter(|_| spec["suspend"] != json!(true)) {
            let since = timestamp(&status["lastScheduleTime"])
                .or_else(|| timestamp(&cronjob["metadata"]["creationTimestamp"]))
                .unwrap_or(now);
            let too_late = |at: &Zoned| {
                spec["startingDeadlineSeconds"]
                    .as_i64()
                    .is_some_and(|d| now.as_second() - at.timestamp().as_second() > d)
            };
            let policy = spec["concurrencyPolicy"].as_str().unwrap_or("Allow");
            if let Some(at) = schedule.most_recent(since, now).filter(|at| !too_late(at)) {
                let blocked = policy == "Forbid" && !active.is_empty();
                if !blocked {
                    if policy == "Replace" {
                        for job in active.drain(..) {
                            delete_job(cluster, jobs_info, &job, report)?;
                        }
                    }
                    let job = job_for(&cronjob, &at);
                    match cluster.create(jobs_info, namespace(&cronjob), job, &opts(MANAGER)) {
                        Ok(created) => {
                            report.writes += 1;
                            active.push(Arc::new(created));
                        }
                        // Created before a restart of the simulation: it is the same run.
                        Err(e) if e.code == 409 => {}
                        Err(e) => return Err(super::write_err("a CronJob's Job", &e)),
                    }
                    status["lastScheduleTime"] = json!(rfc3339(at.timestamp()));
                }
            }
            if let Some(next) = schedule.next(now) {
                wake = Some(wake.map_or(next, |w| w.min(next)));
            }
        }

        let refs: Vec<Value> = active
            .iter()
            .map(|j| {
                json!({"apiVersion": "batch/v1", "kind": "Job", "name": name(j),
                       "namespace": namespace(j), "uid": uid(j),
                       "resourceVersion": j["metadata"]["resourceVersion"]})
            })
            .collect();
        if refs.is_empty() {
            status.as_object_mut().map(|s| s.remove("active"));
        } else {
            status["active"] = json!(refs);
        }
        // A CronJob never scheduled has no status yet: an empty one is not a change.
        if !(cronjob["status"].is_null() && status == json!({})) {
            write_status(cluster, cronjobs, &cronjob, status, MANAGER, report)?;
        }
    }
    Ok(wake)
}

fn delete_job(
    cluster: &mut Cluster,
    jobs_info: &ResourceInfo,
    job: &Value,
    report: &mut PassReport,
) -> Result<(), WorkloadError> {
    let background = DeleteOptions {
        propagation: Some("Background".into()),
        ..Default::default()
    };
    match cluster.delete(jobs_info, namespace(job), name(job), &background) {
        Ok(_) => {
            report.writes += 1;
            Ok(())
        }
        Err(e) if e.code == 404 => Ok(()),
        Err(e) => Err(super::write_err("a CronJob's Job", &e)),
    }
}

/// The Job of one scheduled run: upstream's `getJobFromTemplate2`.
fn job_for(cronjob: &Value, at: &Zoned) -> Value {
    let template = &cronjob["spec"]["jobTemplate"];
    let mut metadata = template["metadata"].clone();
    if !metadata.is_object() {
        metadata = json!({});
    }
    metadata["name"] = json!(format!(
        "{}-{}",
        name(cronjob),
        at.timestamp().as_second().div_euclid(60)
    ));
    metadata["namespace"] = json!(namespace(cronjob));
    if !metadata["annotations"].is_object() {
        metadata["annotations"] = json!({});
    }
    metadata["annotations"][SCHEDULED_TIMESTAMP] = json!(
        at.strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string()
            .replace("+00:00", "Z")
    );
    metadata["ownerReferences"] = json!([super::owner_ref(cronjob, "batch/v1", "CronJob")]);
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata,
           "spec": template["spec"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn the_most_recent_run_since_the_last_one_and_the_next() {
        let every_5 = Schedule::parse("*/5 * * * *", None).expect("valid");
        let now = at("2026-12-01T03:41:10Z");
        let recent = every_5
            .most_recent(at("2026-12-01T03:00:00Z"), now)
            .expect("due");
        assert_eq!(recent.timestamp(), at("2026-12-01T03:40:00Z"));
        // Already run at 03:40: nothing is due until 03:45.
        assert!(
            every_5
                .most_recent(at("2026-12-01T03:40:00Z"), now)
                .is_none()
        );
        assert_eq!(every_5.next(now), Some(at("2026-12-01T03:45:00Z")));
        let hourly = Schedule::parse("@hourly", None).expect("valid");
        assert_eq!(hourly.next(now), Some(at("2026-12-01T04:00:00Z")));
    }

    #[test]
    fn a_time_zone_moves_the_schedule_and_bad_input_is_named() {
        let nine_in_tokyo = Schedule::parse("0 9 * * *", Some("Asia/Tokyo")).expect("valid");
        assert_eq!(
            nine_in_tokyo.next(at("2026-12-01T00:30:00Z")),
            Some(at("2026-12-02T00:00:00Z"))
        );
        let err = Schedule::parse("0 9 * *", None).err().expect("4 fields");
        assert!(err.starts_with("unparseable schedule \"0 9 * *\""), "{err}");
        let err = Schedule::parse("* * * * * *", None).err().expect("seconds");
        assert!(err.contains("unparseable"), "{err}");
        let err = Schedule::parse("* * * * *", Some("Mars/Olympus"))
            .err()
            .expect("zone");
        assert!(
            err.starts_with("unknown time zone \"Mars/Olympus\""),
            "{err}"
        );
    }

    #[test]
    fn a_job_is_named_by_its_minute_and_owned_by_its_cronjob() {
        let cronjob = json!({"metadata": {"name": "nightly", "namespace": "ops", "uid": "u1"},
            "spec": {"jobTemplate": {"metadata": {"labels": {"team": "a"}},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}}});
        let when = at("2026-12-01T03:40:00Z").to_zoned(TimeZone::UTC);
        let job = job_for(&cronjob, &when);
        assert_eq!(job["metadata"]["name"], "nightly-29934940");
        assert_eq!(job["metadata"]["labels"]["team"], "a");
        assert_eq!(
            job["metadata"]["annotations"][SCHEDULED_TIMESTAMP],
            "2026-12-01T03:40:00Z"
        );
        assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "CronJob");
        assert_eq!(job["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["image"],
            "x"
        );
    }
}
