//! The suite's table and SVG: RSS per replica against one replica, writes against the
//! unsharded run, takeover against the lease duration.

use super::*;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// A row compared with a floor of this run, in `unit`, checked against `target` (`"<= 0.35x"`)
/// when given.
fn compared(
    report: &mut Report,
    figure: &str,
    (value, floor): (f64, f64),
    unit: &str,
    target: Option<&str>,
    note: &str,
) {
    match target {
        Some(target) => report.per_object_against(figure, value, floor, target, note),
        None => report.per_object(figure, value, floor, note),
    }
    if let Some(row) = report.rows.last_mut() {
        row.unit = unit.to_string();
    }
}

pub(super) fn report(args: &Args, unsharded: &Run, sharded: &[(Mode, usize, Run)]) -> Report {
    let n = args.nodes.max(1);
    let per_node = |count: u64| count as f64 / n as f64;
    let mut report = Report::new(format!(
        "nodeslo-controller sharded, {n} nodes, {} workers per replica, lease {} s",
        args.workers, args.lease_seconds
    ));
    let secs = |d: Duration| d.as_secs_f64();
    report.row(
        "unsharded (--shards off): converge (create all NodeSLOs)",
        format!("{:.3?}", unsharded.converge),
        "the floor of the converge rows",
    );
    report.row(
        "unsharded (--shards off): config change reaches all NodeSLOs",
        format!("{:.3?}", unsharded.update),
        "the floor of the config change rows",
    );
    report.row(
        "unsharded (--shards off): peak RSS",
        format!("{:.1} MiB", mib(unsharded.max_rss())),
        "one replica, no Lease of its own; the 1-replica rows are compared with it",
    );
    for (phase, writes) in [
        ("on create", unsharded.create_writes),
        ("on config change", unsharded.update_writes),
    ] {
        report.row(
            format!("unsharded (--shards off): NodeSLO writes per node {phase}"),
            format!("{:.3}", per_node(writes.nodeslos)),
            "the floor of the sharded runs' writes rows",
        );
    }

    for mode in Mode::ALL {
        let runs: Vec<&(Mode, usize, Run)> = sharded.iter().filter(|(m, ..)| *m == mode).collect();
        let Some((_, _, baseline)) = runs.iter().find(|(_, r, _)| *r == 1) else {
            continue;
        };
        let base_rss = mib(baseline.max_rss());
        for (_, r, run) in &runs {
            let r = *r;
            let prefix = format!(
                "{}, {r} replica{}",
                mode.name(),
                if r == 1 { "" } else { "s" }
            );
            let rss = mib(run.max_rss());
            if r == 1 {
                report.row(
                    format!("{prefix}: peak RSS of an idle replica"),
                    format!("{:.1} MiB", mib(run.idle_rss)),
                    "one replica of this mode on a cluster without Nodes, leading",
                );
                compared(
                    &mut report,
                    &format!("{prefix}: peak RSS"),
                    (rss, mib(unsharded.max_rss())),
                    "MiB",
                    None,
                    "the baseline of this mode's RSS rows (--shards auto, one replica), \
                     against the unsharded run",
                );
            } else {
                let each: Vec<String> = run
                    .rss
                    .iter()
                    .map(|(id, bytes)| {
                        let leads = if run.leader.as_ref() == Some(id) {
                            " (leader, runs the sharders)"
                        } else {
                            ""
                        };
                        format!("{id} {:.1} MiB{leads}", mib(*bytes))
                    })
                    .collect();
                let goal = format!("<= {RSS_GOAL}x");
                compared(
                    &mut report,
                    &format!("{prefix}: peak RSS per replica (largest)"),
                    (rss, base_rss),
                    "MiB",
                    (r == RSS_GOAL_REPLICAS).then_some(goal.as_str()),
                    &format!("against 1 replica of this mode; {}", each.join(", ")),
                );
                let above = |bytes: u64| mib(bytes.saturating_sub(run.idle_rss));
                compared(
                    &mut report,
                    &format!("{prefix}: peak RSS above an idle replica, per replica (largest)"),
                    (
                        above(run.max_rss()),
                        mib(baseline.max_rss().saturating_sub(baseline.idle_rss)),
                    ),
                    "MiB",
                    (r == RSS_GOAL_REPLICAS).then_some(goal.as_str()),
                    &format!(
                        "what the objects cost: peak RSS less that of one replica of this mode \
                         on a cluster without Nodes ({:.1} MiB: code pages, runtime, clients), \
                         against 1 replica of this mode likewise",
                        mib(run.idle_rss)
                    ),
                );
                if let Some(followers) = run.max_rss_followers() {
                    compared(
                        &mut report,
                        &format!("{prefix}: peak RSS per replica but the leader (largest)"),
                        (mib(followers), base_rss),
                        "MiB",
                        None,
                        &format!(
                            "against 1 replica of this mode, which runs the sharders too \
                             ({:.2}x of the unsharded run); 1/{r} would be {:.2}x",
                            mib(followers) / mib(unsharded.max_rss()).max(f64::EPSILON),
                            1.0 / r as f64
                        ),
                    );
                }
            }
            compared(
                &mut report,
                &format!("{prefix}: converge (create all NodeSLOs)"),
                (secs(run.converge), secs(unsharded.converge)),
                "s",
                None,
                "against the unsharded run; the replicas share the machine's cores",
            );
            compared(
                &mut report,
                &format!("{prefix}: config change reaches all NodeSLOs"),
                (secs(run.update), secs(unsharded.update)),
                "s",
                None,
                "against the unsharded run",
            );
            for (phase, w, floor) in [
                ("on create", run.create_writes, unsharded.create_writes),
                (
                    "on config change",
                    run.update_writes,
                    unsharded.update_writes,
                ),
            ] {
                compared(
                    &mut report,
                    &format!("{prefix}: NodeSLO writes per node {phase}"),
                    (per_node(w.nodeslos), per_node(floor.nodeslos)),
                    "",
                    Some("<= 1x"),
                    &format!(
                        "against the unsharded run; {} answered with an error (conflicts)",
                        w.nodeslos_failed
                    ),
                );
            }
            let w = run.create_writes.plus(run.update_writes);
            let floor = unsharded.create_writes.plus(unsharded.update_writes);
            if mode == Mode::NodeLabels {
                report.row(
                    format!("{prefix}: Node label writes per node (sharder)"),
                    format!("{:.3}", per_node(w.nodes)),
                    "extra, from start until the config change reached every NodeSLO: the \
                     unsharded run writes no Node",
                );
                compared(
                    &mut report,
                    &format!("{prefix}: writes per node, NodeSLOs and Node labels"),
                    (per_node(w.nodeslos + w.nodes), per_node(floor.nodeslos)),
                    "",
                    None,
                    "create and config change, against the unsharded run's NodeSLO writes",
                );
            } else if w.nodes > 0 {
                report.row(
                    format!("{prefix}: Node writes per node"),
                    format!("{:.3}", per_node(w.nodes)),
                    "unexpected: this mode labels no Node",
                );
            }
            report.row(
                format!("{prefix}: Lease, Event and ConfigMap writes"),
                (w.leases + w.events + w.configmaps + w.other).to_string(),
                format!(
                    "not per node: Leases {} (renewals), Events {}, ConfigMaps {} (last-good \
                     record), other {}, from start until the config change reached every NodeSLO \
                     (unsharded: Leases {}, Events {}, ConfigMaps {})",
                    w.leases,
                    w.events,
                    w.configmaps,
                    w.other,
                    floor.leases,
                    floor.events,
                    floor.configmaps
                ),
            );
            if r > 1 {
                let fair = n / r;
                let largest = run.shares.values().copied().max().unwrap_or(0);
                report.row(
                    format!("{prefix}: largest share, of n/{r}"),
                    format!("{:.3}", largest as f64 / fair.max(1) as f64),
                    format!("target <= 1.15 (NodeSLOs per shard: {:?})", run.shares),
                );
            }
            report.row(
                format!("{prefix}: NodeSLO and Node writes in 3 s of steady state"),
                run.steady_writes.to_string(),
                "target 0",
            );
            if !run.takeovers.is_empty() {
                takeover_rows(&mut report, &prefix, args, &run.takeovers);
            }
        }
    }
    let unclean: usize = std::iter::once(unsharded)
        .chain(sharded.iter().map(|(_, _, run)| run))
        .map(|run| run.unclean_exits)
        .sum();
    report.row(
        "replicas that did not exit 0 on SIGTERM",
        unclean.to_string(),
        "target 0 (each drains and releases its shard Lease)",
    );
    report.chart = Some(rss_chart(unsharded, sharded));
    report.convergence = std::iter::once(Series {
        label: "unsharded (--shards off)".to_string(),
        points: unsharded.curve.clone(),
    })
    .chain(Mode::ALL.iter().filter_map(|mode| {
        let (_, r, run) = sharded
            .iter()
            .filter(|(m, ..)| m == mode)
            .max_by_key(|(_, r, _)| *r)?;
        Some(Series {
            label: format!("{}, {r} replicas", mode.name()),
            points: run.curve.clone(),
        })
    }))
    .collect();
    report
}

fn takeover_rows(report: &mut Report, prefix: &str, args: &Args, takeovers: &[Takeover]) {
    let lease = Duration::from_secs(args.lease_seconds.max(1));
    let median_of = |of: fn(&Takeover) -> Duration| {
        median(&takeovers.iter().map(of).collect::<Vec<_>>()).as_secs_f64()
    };
    let victims: Vec<String> = takeovers
        .iter()
        .map(|t| format!("{} ({} NodeSLOs)", t.victim, t.owned))
        .collect();
    let count = takeovers.len();
    // The sharding scenarios' bound: lease duration + 2 s.
    let bound = (lease.as_secs_f64() + 2.0) / lease.as_secs_f64();
    compared(
        report,
        &format!("{prefix}: takeover, a killed shard's NodeSLOs labelled to live shards"),
        (median_of(|t| t.labelled), lease.as_secs_f64()),
        "s",
        Some(format!("<= {bound:.2}x").as_str()),
        &format!(
            "against the lease duration; median of {count} kill -9 of a replica that did not \
             lead: {}; target: lease duration + 2 s",
            victims.join(", ")
        ),
    );
    compared(
        report,
        &format!("{prefix}: takeover, a config change made at the kill reaches them"),
        (median_of(|t| t.reconciled), lease.as_secs_f64()),
        "s",
        None,
        &format!(
            "against the lease duration; the live shards' own NodeSLOs took {:.2} s (median) for \
             the same change",
            median_of(|t| t.rest)
        ),
    );
}

/// Peak RSS per replica (the largest) against replicas, one line per mode, and each mode's goal.
fn rss_chart(unsharded: &Run, sharded: &[(Mode, usize, Run)]) -> Chart {
    let mut lines = Vec::new();
    for (color, mode) in Mode::ALL.iter().enumerate() {
        let points: Vec<(f64, f64)> = sharded
            .iter()
            .filter(|(m, ..)| m == mode)
            .map(|(_, r, run)| (*r as f64, mib(run.max_rss())))
            .collect();
        let Some(&(_, base)) = points.iter().find(|(r, _)| *r == 1.0) else {
            continue;
        };
        let last = points.iter().map(|p| p.0).fold(1.0, f64::max);
        lines.push(Line {
            label: mode.name().to_string(),
            points: points.clone(),
            color,
            dashed: false,
        });
        lines.push(Line {
            label: format!("goal: {RSS_GOAL}x of 1 replica ({})", mode.name()),
            points: vec![(1.0, base * RSS_GOAL), (last, base * RSS_GOAL)],
            color,
            dashed: true,
        });
    }
    let last = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    lines.push(Line {
        label: "unsharded (--shards off)".to_string(),
        points: vec![
            (1.0, mib(unsharded.max_rss())),
            (last, mib(unsharded.max_rss())),
        ],
        color: 3,
        dashed: true,
    });
    Chart {
        title: "peak RSS per replica (largest)".to_string(),
        x_desc: "replicas".to_string(),
        y_desc: "MiB".to_string(),
        lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Row;

    fn row<'a>(report: &'a Report, figure: &str) -> &'a Row {
        report
            .rows
            .iter()
            .find(|r| r.figure == figure)
            .unwrap_or_else(|| panic!("no {figure} in {:?}", report.rows))
    }

    fn run(rss_mib: &[u64], leader: Option<&str>, nodeslos: u64, nodes: u64) -> Run {
        Run {
            converge: Duration::from_secs(2),
            update: Duration::from_secs(3),
            create_writes: Writes {
                nodeslos,
                nodes,
                leases: 10,
                ..Writes::default()
            },
            update_writes: Writes {
                nodeslos: 100,
                ..Writes::default()
            },
            rss: rss_mib
                .iter()
                .enumerate()
                .map(|(i, m)| (format!("nodeslo-{i}"), m * 1048576))
                .collect(),
            leader: leader.map(str::to_string),
            shares: (0..rss_mib.len())
                .map(|i| (format!("nodeslo-{i}"), 100 / rss_mib.len()))
                .collect(),
            ..Run::default()
        }
    }

    #[test]
    fn the_report_compares_rss_with_one_replica_and_writes_with_the_unsharded_run() {
        let args = Args {
            nodes: 100,
            replicas: vec![1, 2, 4],
            workers: 8,
            lease_seconds: 4,
            lease_grace_seconds: 2,
            kills: 1,
        };
        let unsharded = run(&[80], None, 100, 0);
        let mut four = run(&[60, 20, 20, 20], Some("nodeslo-0"), 100, 0);
        four.takeovers = vec![Takeover {
            victim: "nodeslo-1".into(),
            owned: 25,
            labelled: Duration::from_secs(5),
            reconciled: Duration::from_secs(7),
            rest: Duration::from_secs(2),
        }];
        four.idle_rss = 20 * 1048576;
        let mut one = run(&[100], Some("nodeslo-0"), 100, 0);
        one.idle_rss = 20 * 1048576;
        let sharded = vec![
            (Mode::AllNodes, 1, one),
            (Mode::AllNodes, 2, run(&[70, 50], Some("nodeslo-0"), 101, 0)),
            (Mode::AllNodes, 4, four),
            (
                Mode::NodeLabels,
                1,
                run(&[100], Some("nodeslo-0"), 100, 100),
            ),
            (
                Mode::NodeLabels,
                4,
                run(&[30, 20, 20, 20], Some("nodeslo-0"), 100, 100),
            ),
        ];
        let report = report(&args, &unsharded, &sharded);
        let rss = row(
            &report,
            "all Nodes watched, 4 replicas: peak RSS per replica (largest)",
        );
        assert_eq!(
            (rss.value, rss.floor, rss.unit.as_str()),
            (60.0, Some(100.0), "MiB")
        );
        assert_eq!(
            (rss.target.as_deref(), rss.met),
            (Some("<= 0.35x"), Some(false))
        );
        // Above an idle replica of 20 MiB: 40 MiB of 80.
        let above = row(
            &report,
            "all Nodes watched, 4 replicas: peak RSS above an idle replica, per replica (largest)",
        );
        assert_eq!(
            (above.value, above.floor, above.ratio, above.met),
            (40.0, Some(80.0), Some(0.5), Some(false))
        );
        assert_eq!(
            row(
                &report,
                "all Nodes watched, 1 replica: peak RSS of an idle replica"
            )
            .value,
            20.0
        );
        let followers = row(
            &report,
            "all Nodes watched, 4 replicas: peak RSS per replica but the leader (largest)",
        );
        assert_eq!(followers.ratio, Some(0.2));
        let labels = row(
            &report,
            "--shard-node-labels, 4 replicas: peak RSS per replica (largest)",
        );
        // The target is checked on the ratio: 30 MiB of 100 is the goal met.
        assert_eq!((labels.ratio, labels.met), (Some(0.3), Some(true)));
        let two = row(
            &report,
            "all Nodes watched, 2 replicas: peak RSS per replica (largest)",
        );
        assert_eq!((two.target.as_deref(), two.met), (None, None));
        let writes = row(
            &report,
            "all Nodes watched, 2 replicas: NodeSLO writes per node on create",
        );
        assert_eq!((writes.ratio, writes.met), (Some(1.01), Some(false)));
        let writes = row(
            &report,
            "--shard-node-labels, 4 replicas: NodeSLO writes per node on config change",
        );
        assert_eq!(writes.met, Some(true));
        let all = row(
            &report,
            "--shard-node-labels, 4 replicas: writes per node, NodeSLOs and Node labels",
        );
        assert_eq!((all.value, all.floor), (3.0, Some(2.0)));
        let node_labels = row(
            &report,
            "--shard-node-labels, 4 replicas: Node label writes per node (sharder)",
        );
        assert_eq!(node_labels.value, 1.0);
        let takeover = row(
            &report,
            "all Nodes watched, 4 replicas: takeover, a killed shard's NodeSLOs labelled to live shards",
        );
        assert_eq!((takeover.ratio, takeover.met), (Some(1.25), Some(true)));
        assert_eq!(takeover.target.as_deref(), Some("<= 1.5x"));
        let chart = report.chart.as_ref().expect("chart");
        assert_eq!(chart.lines.len(), 5, "{chart:?}");
        assert_eq!(
            chart.lines[0].points,
            [(1.0, 100.0), (2.0, 70.0), (4.0, 60.0)]
        );
        assert_eq!(chart.lines[1].points, [(1.0, 35.0), (4.0, 35.0)]);
        let exits = row(&report, "replicas that did not exit 0 on SIGTERM");
        assert_eq!(exits.met, Some(true));
    }
}
