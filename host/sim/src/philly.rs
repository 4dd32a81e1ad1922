//! Microsoft's Philly GPU-cluster job log (`cluster_job_log` of the public Philly traces, and
//! subsets written in its shape) as a replay [`Scenario`]: real arrivals and run times of multi-GPU
//! jobs that run for hours to weeks — the kind of trace where what reclaim throws away matters.
//!
//! Each record is a job: `jobid` (or `id`), `submitted_time`, `attempts` (each with `start_time`,
//! `end_time` and, in the full log, `detail: [{ip, gpus: [...]}]`), and where present `vc` (the
//! virtual cluster: a team's queue), `user` and `num_gpus`. A job becomes:
//!
//! - **arrival**: its submission, in seconds after the first one's;
//! - **duration**: the sum of its attempts' run times — the work it needed, failed tries included
//!   (the replay has no failures, so it runs that long at once);
//! - **GPUs**: `num_gpus`, else the GPUs its last attempt held; a job larger than a node becomes a
//!   gang of equal members of at most a node's GPUs each (64 GPUs on 8-GPU nodes: 8 × 8);
//! - **queue**: its `vc`; with `queues = n` (a log without teams, or to pool them) one of `q0` …
//!   `q{n-1}` by a hash of its id, so each holds a fair sample of the trace.
//!
//! Records without a submission time, an attempt with both times, or a GPU are left out and
//! reported, never guessed. Times are `YYYY-MM-DD HH:MM:SS` (the log's own format, one time zone).

use std::collections::BTreeSet;

use serde::Deserialize;

use crate::timed::{Job, QueueConfig, Scenario, ScenarioNode};
use crate::trace::TraceError;

/// How a Philly log becomes a scenario.
#[derive(Clone, Debug)]
pub struct PhillyOptions {
    /// Nodes of the cluster the jobs are replayed on.
    pub nodes: usize,
    /// GPUs per node (Philly's servers had 2, 4 or 8).
    pub gpus_per_node: u32,
    /// GPU model written on the nodes.
    pub model: String,
    /// `Some(n)`: `n` queues of equal weight, jobs spread by a hash of their id; `None`: one queue
    /// per virtual cluster (`vc`), `default` for records without one.
    pub queues: Option<usize>,
}

#[derive(Deserialize)]
struct Record {
    #[serde(alias = "jobid")]
    id: String,
    #[serde(default)]
    vc: Option<String>,
    #[serde(default)]
    num_gpus: Option<u32>,
    #[serde(default)]
    submitted_time: Option<String>,
    #[serde(default)]
    attempts: Vec<Attempt>,
}

#[derive(Deserialize)]
struct Attempt {
    #[serde(default)]
    start_time: Option<String>,
    #[serde(default)]
    end_time: Option<String>,
    #[serde(default)]
    detail: Vec<Detail>,
}

#[derive(Deserialize)]
struct Detail {
    #[serde(default)]
    gpus: Vec<serde_json::Value>,
}

/// The log in `text` (a JSON array of job records, from `file`) as a scenario, and one line for
/// each record left out.
pub fn scenario(file: &str, text: &str, options: &PhillyOptions) -> Result<(Scenario, Vec<String>), TraceError> {
    if options.gpus_per_node == 0 || options.nodes == 0 || options.queues == Some(0) {
        return Err(malformed(file, "nodes, GPUs per node and queues must be at least 1".into()));
    }
    let records: Vec<Record> = serde_json::from_str(text).map_err(|e| TraceError::Malformed {
        file: file.into(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let mut skipped = Vec::new();
    let mut kept: Vec<(i64, Job)> = Vec::new();
    for r in records {
        match job(&r, options) {
            Ok(j) => kept.push(j),
            Err(why) => skipped.push(format!("job {}: {why}", r.id)),
        }
    }
    let first = kept.iter().map(|(t, _)| *t).min().unwrap_or(0);
    let mut jobs: Vec<Job> = kept
        .into_iter()
        .map(|(t, mut j)| {
            j.arrival = (t - first) as u64;
            j
        })
        .collect();
    jobs.sort_by(|a, b| (a.arrival, &a.name).cmp(&(b.arrival, &b.name)));
    let names: BTreeSet<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    let queues = names.into_iter().map(QueueConfig::named).collect();
    let nodes = (0..options.nodes)
        .map(|i| ScenarioNode {
            name: format!("node-{i:04}"),
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            gpus: options.gpus_per_node,
            model: options.model.clone(),
            topology: None,
            labels: Default::default(),
            accelerator: None,
        })
        .collect();
    Ok((Scenario { nodes, flavors: Vec::new(), queues, jobs, dra: None, levels: Vec::new(), fabric: None }, skipped))
}

/// One record as (submission in seconds since the epoch, job), or why it is left out.
fn job(r: &Record, options: &PhillyOptions) -> Result<(i64, Job), String> {
    let submitted = r.submitted_time.as_deref().and_then(seconds).ok_or("no submission time")?;
    let mut ran = 0i64;
    let mut any = false;
    for a in &r.attempts {
        if let (Some(start), Some(end)) =
            (a.start_time.as_deref().and_then(seconds), a.end_time.as_deref().and_then(seconds))
        {
            ran += (end - start).max(0);
            any = true;
        }
    }
    if !any {
        return Err("no attempt with a start and an end".into());
    }
    let held = r.attempts.last().map_or(0, |a| a.detail.iter().map(|d| d.gpus.len() as u32).sum::<u32>());
    let gpus = r.num_gpus.filter(|&n| n > 0).unwrap_or(held);
    if gpus == 0 {
        return Err("no GPU".into());
    }
    let per_member = member_size(gpus, options.gpus_per_node);
    let queue = match options.queues {
        Some(n) => format!("q{}", fnv1a(&r.id) % n as u64),
        None => r.vc.clone().filter(|v| !v.is_empty()).unwrap_or_else(|| "default".into()),
    };
    Ok((
        submitted,
        Job {
            name: r.id.clone(),
            queue,
            duration: Some(ran.max(1) as u64),
            cpu_milli: 1000 * u64::from(per_member),
            memory_mib: 8 * 1024 * u64::from(per_member),
            gpus: per_member,
            gpu_milli: 1000,
            replicas: gpus / per_member,
            ..Job::default()
        },
    ))
}

/// GPUs of each member: the whole job when it fits a node, else the largest divisor of it that
/// does (so the members are equal and hold exactly the job's GPUs).
fn member_size(gpus: u32, per_node: u32) -> u32 {
    if gpus <= per_node {
        return gpus;
    }
    (1..=per_node).rev().find(|d| gpus.is_multiple_of(*d)).unwrap_or(1)
}

/// `YYYY-MM-DD HH:MM:SS` as seconds since 1970-01-01 (no time zone: the log has one).
fn seconds(text: &str) -> Option<i64> {
    let (date, time) = text.trim().split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(y, m, day) * 86_400 + h * 3600 + min * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A stable hash, so a job lands in the same queue on every machine and run.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn malformed(file: &str, message: String) -> TraceError {
    TraceError::Malformed { file: file.into(), line: 0, column: 0, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three records in the full log's shape (a team per `vc`, GPUs from `detail`) and one of the
    /// subsets' (`num_gpus`, no team), plus records the converter must leave out.
    const LOG: &str = r#"[
      {"jobid": "application_1", "vc": "team-a", "user": "u1", "status": "Pass",
       "submitted_time": "2017-10-01 00:00:00",
       "attempts": [{"start_time": "2017-10-01 00:00:10", "end_time": "2017-10-01 00:01:10",
                     "detail": [{"ip": "m1", "gpus": ["gpu0"]}]},
                    {"start_time": "2017-10-01 00:02:00", "end_time": "2017-10-01 01:02:00",
                     "detail": [{"ip": "m1", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"]},
                                {"ip": "m2", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"]}]}]},
      {"jobid": "application_2", "vc": "team-b", "submitted_time": "2017-09-30 23:59:00",
       "attempts": [{"start_time": "2017-10-01 00:00:00", "end_time": "2017-10-02 00:00:00",
                     "detail": [{"ip": "m3", "gpus": ["gpu0", "gpu1", "gpu2", "gpu3"]}]}]},
      {"id": "application_3", "num_gpus": 12, "submitted_time": "2017-12-31 23:59:59",
       "attempts": [{"start_time": "2018-01-01 00:00:00", "end_time": "2018-01-01 00:00:30"}]},
      {"jobid": "never-ran", "vc": "team-a", "submitted_time": "2017-10-01 00:00:00",
       "attempts": [{"start_time": "2017-10-01 00:00:10", "end_time": "None"}]},
      {"jobid": "no-time", "vc": "team-a", "submitted_time": "None", "attempts": []},
      {"jobid": "cpu-only", "vc": "team-a", "submitted_time": "2017-10-01 00:00:00",
       "attempts": [{"start_time": "2017-10-01 00:00:10", "end_time": "2017-10-01 00:00:20", "detail": []}]}
    ]"#;

    fn options(queues: Option<usize>) -> PhillyOptions {
        PhillyOptions { nodes: 4, gpus_per_node: 8, model: "P100".into(), queues }
    }

    #[test]
    fn jobs_keep_their_real_arrivals_run_times_sizes_and_teams() {
        let (s, skipped) = scenario("log.json", LOG, &options(None)).unwrap();
        type Row<'a> = (&'a str, &'a str, u64, Option<u64>, u32, u32);
        let summary: Vec<Row> = s
            .jobs
            .iter()
            .map(|j| (j.name.as_str(), j.queue.as_str(), j.arrival, j.duration, j.gpus, j.replicas))
            .collect();
        assert_eq!(
            summary,
            [
                // First submitted: arrival 0; one day on 4 GPUs.
                ("application_2", "team-b", 0, Some(86_400), 4, 1),
                // 60 s later; 60 + 3,600 s of attempts; its last attempt's 16 GPUs as 2 × 8.
                ("application_1", "team-a", 60, Some(3_660), 8, 2),
                // Three months on, across a year end; 12 GPUs on 8-GPU nodes: 2 × 6; no team.
                ("application_3", "default", 92 * 86_400 + 59, Some(30), 6, 2),
            ]
        );
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped[0].starts_with("job never-ran: no attempt with a start and an end"), "{skipped:?}");
        assert!(skipped[1].starts_with("job no-time: no submission time"), "{skipped:?}");
        assert!(skipped[2].starts_with("job cpu-only: no GPU"), "{skipped:?}");
        let queues: Vec<&str> = s.queues.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(queues, ["default", "team-a", "team-b"]);
        assert_eq!((s.nodes.len(), s.nodes[3].gpus, s.nodes[3].model.as_str()), (4, 8, "P100"));
        // What it writes reads back as the same scenario, and replays.
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(Scenario::parse("back.json", &json).unwrap(), s);
    }

    #[test]
    fn hashed_queues_are_stable_and_bad_input_is_refused_with_its_place() {
        let (a, _) = scenario("log.json", LOG, &options(Some(3))).unwrap();
        let (b, _) = scenario("log.json", LOG, &options(Some(3))).unwrap();
        assert_eq!(a, b);
        assert!(a.jobs.iter().all(|j| ["q0", "q1", "q2"].contains(&j.queue.as_str())), "{:?}", a.jobs);
        let e = scenario("log.json", "[{\"jobid\": 1}]", &options(None)).unwrap_err().to_string();
        assert!(e.starts_with("log.json:1:"), "{e}");
        assert!(scenario("log.json", LOG, &options(Some(0))).is_err());
        assert_eq!(seconds("2017-13-01 00:00:00"), None);
        assert_eq!(seconds("1970-01-02 00:00:01"), Some(86_401));
        assert_eq!(seconds("2000-03-01 00:00:00"), Some(951_868_800));
    }
}
