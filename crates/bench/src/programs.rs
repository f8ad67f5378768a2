//! CPU time by program: this process (the in-process kube-sims with their kubelets and workload
//! simulation, and the bench's own clients) and each program among its children (controllers,
//! sidecars the kubelets run). Where the machine-wide figure says how much, this says who.
//!
//! A live child's time is the sum of its threads' `/proc/<pid>/task/<tid>/schedstat` (nanoseconds,
//! where `/proc/<pid>/stat` counts 10 ms ticks). A child that exited between two readings is
//! counted through `RUSAGE_CHILDREN`, which the kubelets' reaping of their containers feeds.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result};
use nix::sys::resource::{UsageWho, getrusage};

/// The name this process's own time is reported under.
pub const THIS_PROCESS: &str = "capstan-bench (kube-sims, kubelets, bench clients)";

/// The name of exited children's time when they ran more than one program.
const EXITED: &str = "exited children";

/// One reading of CPU time by process.
#[derive(Debug)]
pub struct ProgramCpu {
    own: Duration,
    /// The children that exited and were reaped, in total.
    reaped: Duration,
    /// Live children: pid -> (program, CPU so far).
    children: HashMap<i32, (String, Duration)>,
}

impl ProgramCpu {
    /// A reading once no child is a zombie: an exited child's threads are gone from /proc before
    /// its parent reaps it, and only then does its time reach `RUSAGE_CHILDREN`. The kubelets
    /// (tasks of this process) reap their containers at once; a child nobody reaps within
    /// 100 ms is read as it is.
    pub async fn now() -> Result<Self> {
        for _ in 0..100 {
            let (reading, zombies) = Self::read()?;
            if !zombies {
                return Ok(reading);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(Self::read()?.0)
    }

    /// This process's time and its children's, and whether a child is a zombie.
    fn read() -> Result<(Self, bool)> {
        let me = std::process::id() as i32;
        let (mut children, mut zombies) = (HashMap::new(), false);
        for entry in std::fs::read_dir("/proc").context("reading /proc")? {
            let Ok(pid) = entry?.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // A process that ends while it is read is simply not counted live.
            let Some(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|line| Stat::parse(&line))
            else {
                continue;
            };
            if stat.parent != me {
                continue;
            }
            zombies |= stat.state == 'Z';
            if let Ok(cpu) = threads_cpu(pid) {
                children.insert(pid, (stat.program, cpu));
            }
        }
        let reading = Self {
            own: usage(UsageWho::RUSAGE_SELF)?,
            reaped: usage(UsageWho::RUSAGE_CHILDREN)?,
            children,
        };
        Ok((reading, zombies))
    }

    /// The CPU each program spent from `earlier` to this reading.
    pub fn since(&self, earlier: &Self) -> BTreeMap<String, Duration> {
        let mut by_program = BTreeMap::new();
        by_program.insert(
            THIS_PROCESS.to_string(),
            self.own.saturating_sub(earlier.own),
        );
        for (pid, (program, cpu)) in &self.children {
            let before = earlier
                .children
                .get(pid)
                .filter(|(p, _)| p == program)
                .map_or(Duration::ZERO, |(_, cpu)| *cpu);
            *by_program.entry(program.clone()).or_default() += cpu.saturating_sub(before);
        }
        // Children that exited meanwhile: their whole lifetime came into `reaped`, of which the
        // part before `earlier` was already counted there as theirs.
        let gone: Vec<&(String, Duration)> = earlier
            .children
            .iter()
            .filter(|(pid, _)| !self.children.contains_key(pid))
            .map(|(_, child)| child)
            .collect();
        let counted_before: Duration = gone.iter().map(|(_, cpu)| *cpu).sum();
        let exited = self
            .reaped
            .saturating_sub(earlier.reaped)
            .saturating_sub(counted_before);
        let program = match gone.first() {
            Some((first, _)) if gone.iter().all(|(p, _)| p == first) => first.clone(),
            _ => EXITED.to_string(),
        };
        if !exited.is_zero() {
            *by_program.entry(program).or_default() += exited;
        }
        by_program
    }
}

/// What a `/proc/<pid>/stat` line says that matters here.
#[derive(Debug, PartialEq, Eq)]
pub struct Stat {
    pub program: String,
    /// `R`, `S`, ..., `Z` for an exited process its parent has not reaped.
    pub state: char,
    pub parent: i32,
    /// User plus system time of every thread, dead ones included, counted in USER_HZ ticks,
    /// which Linux fixes at 100 per second for this file.
    pub cpu: Duration,
}

impl Stat {
    /// A `pid (comm) state ppid ...` line. The name may hold spaces and parentheses, so the
    /// fields are read after its last `)`.
    pub fn parse(line: &str) -> Option<Self> {
        let open = line.find('(')?;
        let close = line.rfind(')')?;
        let program = line.get(open + 1..close)?.to_string();
        let fields: Vec<&str> = line.get(close + 1..)?.split_whitespace().collect();
        let state = fields.first()?.chars().next()?;
        let parent = fields.get(1)?.parse().ok()?;
        // Fields 14 and 15 of the line (utime, stime) are the 12th and 13th after the name.
        let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
        let cpu = Duration::from_millis((ticks(11)? + ticks(12)?) * 10);
        Some(Self {
            program,
            state,
            parent,
            cpu,
        })
    }
}

/// The time on CPU of every live thread of `pid`.
fn threads_cpu(pid: i32) -> Result<Duration> {
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        let Ok(schedstat) = std::fs::read_to_string(&path) else {
            continue;
        };
        total += parse_schedstat(&schedstat)
            .with_context(|| format!("unexpected {}: {schedstat:?}", path.display()))?;
    }
    Ok(total)
}

/// The first field of `schedstat`: nanoseconds on a CPU.
fn parse_schedstat(schedstat: &str) -> Option<Duration> {
    let ns = schedstat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// User plus system time of `who` (this process, or its reaped children).
pub fn usage(who: UsageWho) -> Result<Duration> {
    let usage = getrusage(who)?;
    let micros = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Ok(micros(usage.user_time()) + micros(usage.system_time()))
}

/// `by_program` as `name 1.2 ms, ...`, each divided by `per` (recycles, say), largest first.
pub fn summary(by_program: &BTreeMap<String, Duration>, per: usize) -> String {
    let mut rows: Vec<_> = by_program.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1));
    rows.iter()
        .map(|(program, cpu)| {
            format!(
                "{program} {:.1} ms",
                cpu.as_secs_f64() * 1e3 / per.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_the_program_its_parent_and_its_time_even_with_odd_names() {
        let stat = |program: &str, state, parent, ms| Stat {
            program: program.to_string(),
            state,
            parent,
            cpu: Duration::from_millis(ms),
        };
        let fields = "17 4242 17 0 -1 4194560 100 0 0 0 25 7 0 0 20 0";
        assert_eq!(
            Stat::parse(&format!("4242 (gw-sidecar) S {fields}")),
            Some(stat("gw-sidecar", 'S', 17, 320))
        );
        assert_eq!(
            Stat::parse(&format!("9 (a (b) c) Z {fields}")),
            Some(stat("a (b) c", 'Z', 17, 320))
        );
        assert_eq!(Stat::parse("9 gw-sidecar S 3"), None);
        assert_eq!(Stat::parse("9 (short) S 3 9 9"), None);
        assert_eq!(
            parse_schedstat("123456789 5000 12\n"),
            Some(Duration::from_nanos(123_456_789))
        );
        assert_eq!(parse_schedstat(""), None);
    }

    fn reading(own: u64, reaped: u64, children: &[(i32, &str, u64)]) -> ProgramCpu {
        ProgramCpu {
            own: Duration::from_millis(own),
            reaped: Duration::from_millis(reaped),
            children: children
                .iter()
                .map(|&(pid, p, ms)| (pid, (p.to_string(), Duration::from_millis(ms))))
                .collect(),
        }
    }

    #[test]
    fn live_children_count_their_growth_and_exited_ones_what_reaping_added() {
        let before = reading(100, 50, &[(1, "gw-recycler", 10), (2, "gw-sidecar", 4)]);
        // gw-sidecar 2 ran 3 ms more and exited (its 7 ms lifetime reaped); gw-sidecar 3 started.
        let after = reading(130, 57, &[(1, "gw-recycler", 25), (3, "gw-sidecar", 2)]);
        let spent = after.since(&before);
        assert_eq!(spent[THIS_PROCESS], Duration::from_millis(30));
        assert_eq!(spent["gw-recycler"], Duration::from_millis(15));
        assert_eq!(spent["gw-sidecar"], Duration::from_millis(2 + 3));
        assert_eq!(
            summary(&spent, 1),
            format!("{THIS_PROCESS} 30.0 ms, gw-recycler 15.0 ms, gw-sidecar 5.0 ms")
        );
    }

    #[tokio::test]
    async fn this_process_and_its_children_are_read_from_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let reading = ProgramCpu::now().await.expect("reads /proc");
        let _ = child.kill();
        let _ = child.wait();
        let pid = child.id() as i32;
        assert_eq!(
            reading.children.get(&pid).map(|(p, _)| p.as_str()),
            Some("sleep")
        );
        assert!(!reading.own.is_zero());
    }
}
