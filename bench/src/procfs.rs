//! What the benchmark reads from Linux's `/proc`: CPU time and peak memory of
//! a process, CPU time of a whole PostgreSQL server, and the machine's size.

use anyhow::{Context, Result};
use std::fs;
use std::path::Path;

/// Clock ticks per second when `getconf CLK_TCK` cannot be asked (Linux's usual value).
const DEFAULT_CLK_TCK: f64 = 100.0;

/// Kibibytes per mebibyte.
const KIB_PER_MIB: f64 = 1024.0;

/// Converts the clock ticks of `/proc/<pid>/stat` to seconds.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Ticks per second.
    pub hz: f64,
}

impl Clock {
    /// Asks `getconf CLK_TCK` (no libc call needed: the binary stays free of unsafe code).
    pub fn probe() -> Clock {
        let hz = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|hz| *hz > 0.0)
            .unwrap_or(DEFAULT_CLK_TCK);
        Clock { hz }
    }

    /// Seconds in `ticks`.
    pub fn secs(self, ticks: u64) -> f64 {
        ticks as f64 / self.hz
    }
}

/// The fields of `/proc/<pid>/stat` the benchmark needs (all in clock ticks).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcStat {
    /// Parent process id.
    pub ppid: u32,
    /// User CPU of the process (all its threads).
    pub utime: u64,
    /// System CPU of the process.
    pub stime: u64,
    /// User CPU of its children that exited and were waited for.
    pub cutime: u64,
    /// System CPU of those children.
    pub cstime: u64,
}

impl ProcStat {
    /// The process's own CPU, user + system.
    pub fn own(&self) -> u64 {
        self.utime + self.stime
    }

    /// Its own CPU plus that of its reaped children.
    pub fn with_children(&self) -> u64 {
        self.own() + self.cutime + self.cstime
    }
}

/// Reads `/proc/<pid>/stat` (`pid` = "self" works too). A zombie (exited, not
/// yet reaped) still answers with its final times.
pub fn stat(pid: &str) -> Result<ProcStat> {
    let path = format!("/proc/{pid}/stat");
    let text = fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_stat(&text).with_context(|| format!("cannot parse {path}: {text}"))
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) is in parentheses and may hold spaces, so
    // count fields after its closing parenthesis: field 3 (state) is index 0.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(ProcStat {
        ppid: u32::try_from(field(4)?).ok()?,
        utime: field(14)?,
        stime: field(15)?,
        cutime: field(16)?,
        cstime: field(17)?,
    })
}

/// Peak resident memory (`VmHWM`) of `pid` in KiB; `None` once it has exited.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    meminfo_field(&text, "VmHWM:")
}

/// CPU ticks spent by the PostgreSQL server whose postmaster is `postmaster`:
/// the postmaster itself, its live children (backends, background workers),
/// and the children that already exited (counted in its cutime/cstime).
pub fn server_cpu_ticks(postmaster: u32) -> Result<u64> {
    // Children first: one that exits in between is then counted twice (a few
    // ticks) rather than lost.
    let children: u64 = children_cpu_ticks(postmaster)
        .into_iter()
        .map(|(_, ticks)| ticks)
        .sum();
    Ok(children + stat(&postmaster.to_string())?.with_children())
}

/// The live children of `parent` with their own CPU ticks.
pub fn children_cpu_ticks(parent: u32) -> Vec<(u32, u64)> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let name = entry.ok()?.file_name();
        let pid: u32 = name.to_str()?.parse().ok()?;
        // Processes vanish while we scan; that is not an error.
        let s = stat(&pid.to_string()).ok()?;
        (s.ppid == parent).then_some((pid, s.own()))
    })
    .collect()
}

/// The command line of `pid` with NULs as spaces (PostgreSQL puts its
/// process title there).
pub fn cmdline(pid: u32) -> Option<String> {
    let bytes = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text = String::from_utf8_lossy(&bytes).replace('\0', " ");
    Some(text.trim().to_string())
}

/// The postmaster's pid, from the first line of `postmaster.pid` in `data_dir`.
pub fn postmaster_pid(data_dir: &Path) -> Result<u32> {
    let path = data_dir.join("postmaster.pid");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .with_context(|| format!("{} does not start with a pid", path.display()))
}

/// CPU ticks the whole machine spent busy so far, all cores (first line of
/// `/proc/stat`: user, nice, system, irq, softirq, steal; guest time is
/// already inside user).
pub fn machine_busy_ticks() -> Result<u64> {
    let text = fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let line = text.lines().next().unwrap_or_default();
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| fields.get(i))
        .sum();
    Ok(busy)
}

/// `/proc/loadavg`'s three load averages.
pub fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Total memory of the machine in MiB (`MemTotal` of `/proc/meminfo`).
pub fn mem_total_mib() -> Option<f64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_field(&text, "MemTotal:").map(kib_to_mib)
}

/// Cores this process may use (what `nproc` prints).
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// KiB to MiB.
pub fn kib_to_mib(kib: u64) -> f64 {
    kib as f64 / KIB_PER_MIB
}

/// The number after `key` in a `/proc` "Key:   123 kB" listing.
fn meminfo_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_survives_spaces_and_parentheses_in_the_name() {
        let line = "42 (a (b) c) S 7 1 1 0 -1 0 0 0 0 0 11 22 33 44 20 0 1 0 5 6 7";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            (s.ppid, s.utime, s.stime, s.cutime, s.cstime),
            (7, 11, 22, 33, 44)
        );
        assert_eq!(s.with_children(), 110);
    }

    #[test]
    fn meminfo_fields_parse() {
        let text = "VmPeak:\t  1000 kB\nVmHWM:\t  2048 kB\n";
        assert_eq!(meminfo_field(text, "VmHWM:"), Some(2048));
        assert_eq!(meminfo_field(text, "VmRSS:"), None);
    }
}
