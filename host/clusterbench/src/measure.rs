//! What a run measures besides its clocks: the API server's request counters and process figures
//! (its own `/metrics`), and a local process's CPU time and memory (`/proc`).

use std::collections::BTreeMap;

/// The API server's counters at one moment, from its Prometheus text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerSample {
    /// `apiserver_request_total` summed over codes and scopes, by `"VERB resource[/subresource]"`.
    pub requests: BTreeMap<String, f64>,
    /// `process_cpu_seconds_total`.
    pub cpu_seconds: Option<f64>,
    /// `process_resident_memory_bytes`.
    pub rss_bytes: Option<f64>,
}

impl ServerSample {
    /// Reads the samples this needs from the server's `/metrics` text; other lines are skipped.
    pub fn parse(text: &str) -> ServerSample {
        let mut sample = ServerSample::default();
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            match name {
                "apiserver_request_total" => {
                    let label = |key: &str| label_value(labels, key).unwrap_or_default();
                    let resource = match label("subresource") {
                        "" => label("resource").to_string(),
                        sub => format!("{}/{sub}", label("resource")),
                    };
                    *sample.requests.entry(format!("{} {resource}", label("verb"))).or_default() += value;
                }
                "process_cpu_seconds_total" => sample.cpu_seconds = Some(value),
                "process_resident_memory_bytes" => sample.rss_bytes = Some(value),
                _ => {}
            }
        }
        sample
    }

    /// The requests counted since `before`, by kind, leaving out kinds that did not move.
    pub fn requests_since(&self, before: &ServerSample) -> BTreeMap<String, f64> {
        self.requests
            .iter()
            .map(|(k, v)| (k.clone(), v - before.requests.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect()
    }
}

/// The value of `key` in a Prometheus label set `a="x",b="y"` (no escaped quotes in the values
/// this reads).
fn label_value<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let (v, after) = after.split_once('"')?;
        if k.trim_start_matches(',') == key {
            return Some(v);
        }
        rest = after;
    }
    None
}

/// A local process at one moment (`/proc/PID`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU seconds so far.
    pub cpu_seconds: f64,
    /// Resident memory now.
    pub rss_bytes: u64,
    /// The most resident memory it ever had (`VmHWM`).
    pub peak_rss_bytes: u64,
}

impl ProcessSample {
    /// Reads `/proc/PID/stat` and `/proc/PID/status`.
    pub fn read(pid: u32) -> std::io::Result<ProcessSample> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        ProcessSample::parse(&stat, &status)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("/proc/{pid}: unreadable")))
    }

    /// From the texts of `/proc/PID/stat` and `/proc/PID/status`. CPU times in `stat` count
    /// `USER_HZ` ticks, which Linux fixes at 100 per second for every architecture's user ABI.
    pub fn parse(stat: &str, status: &str) -> Option<ProcessSample> {
        // The command name (field 2) may hold spaces and parentheses: count fields after its end.
        let after_name = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(key))?;
            line[key.len()..].split_whitespace().next()?.parse().ok()
        };
        Some(ProcessSample {
            cpu_seconds: ticks as f64 / 100.0,
            rss_bytes: kib("VmRSS:")? * 1024,
            peak_rss_bytes: kib("VmHWM:")? * 1024,
        })
    }
}

/// Open file descriptors of a local process (`/proc/PID/fd`).
pub fn open_fds(pid: u32) -> std::io::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// The `q`-quantile (0..=1) of sorted `values` by the nearest rank; `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as kube-apiserver v1.36 writes them.
    const METRICS: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 5000
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 3
apiserver_request_total{code="201",component="apiserver",dry_run="",group="events.k8s.io",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 4990
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
process_cpu_seconds_total 812.5
process_resident_memory_bytes 1.2345e+09
"#;

    #[test]
    fn request_counters_add_up_by_verb_and_resource_across_codes() {
        let s = ServerSample::parse(METRICS);
        assert_eq!(s.requests["POST pods/binding"], 5003.0);
        assert_eq!(s.requests["POST events"], 4990.0);
        assert_eq!(s.requests["WATCH pods"], 2.0);
        assert_eq!(s.cpu_seconds, Some(812.5));
        assert_eq!(s.rss_bytes, Some(1.2345e9));
        let mut before = s.clone();
        before.requests.insert("POST pods/binding".into(), 1000.0);
        let delta = s.requests_since(&before);
        assert_eq!(delta.len(), 1, "{delta:?}");
        assert_eq!(delta["POST pods/binding"], 4003.0);
    }

    #[test]
    fn a_process_s_cpu_and_memory_come_from_proc_even_with_a_strange_name() {
        let stat = "4242 (sched (v2) x) S 1 4242 4242 0 -1 4194560 1 2 3 4 250 75 0 0 20 0 9 0 100 1 2";
        let status = "Name:\tsched\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t9\n";
        let p = ProcessSample::parse(stat, status).unwrap();
        assert_eq!(p.cpu_seconds, 3.25);
        assert_eq!(p.rss_bytes, 100 * 1024 * 1024);
        assert_eq!(p.peak_rss_bytes, 200 * 1024 * 1024);
        assert!(ProcessSample::parse("1 (x) S", status).is_none());
        let me = ProcessSample::read(std::process::id()).unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let with = open_fds(std::process::id()).unwrap();
        drop(file);
        assert_eq!(open_fds(std::process::id()).unwrap() + 1, with, "an open file is counted");
        assert!(me.rss_bytes > 0 && me.peak_rss_bytes >= me.rss_bytes);
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(50.0));
        assert_eq!(quantile(&v, 0.99), Some(99.0));
        assert_eq!(quantile(&v, 1.0), Some(100.0));
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
