//! The run's counters over time: every process's cumulative per-shard
//! counters, read every 50 ms, summed across processes and interpolated, so
//! that any window (a 1 s bin, the time before a disturbance) can be asked.

use super::proto::Sample;
use shardq::worker::metrics::ShardCountersSnapshot;

/// Resolution of [`Timeline::reach`] (s).
const REACH_STEP_S: f64 = 0.01;

/// Which counter.
pub type Field = fn(&ShardCountersSnapshot) -> u64;

/// Outcomes written.
pub fn completed(c: &ShardCountersSnapshot) -> u64 {
    c.completed
}

/// Jobs claimed.
pub fn claimed(c: &ShardCountersSnapshot) -> u64 {
    c.claimed
}

/// The counters of every process, time in seconds since `go`.
pub struct Timeline {
    procs: Vec<Vec<(f64, Vec<ShardCountersSnapshot>)>>,
    /// Number of shards.
    pub shards: usize,
}

impl Timeline {
    /// From the samples of each process; `go_unix_ms` is time zero.
    pub fn new(samples: &[Vec<Sample>], go_unix_ms: f64, shards: usize) -> Timeline {
        let procs = samples
            .iter()
            .map(|s| {
                s.iter()
                    .map(|x| ((x.unix_ms - go_unix_ms) / 1e3, x.shards.clone()))
                    .collect()
            })
            .collect();
        Timeline { procs, shards }
    }

    /// The last reading's time.
    pub fn end(&self) -> f64 {
        self.procs
            .iter()
            .filter_map(|p| p.last().map(|(t, _)| *t))
            .fold(0.0, f64::max)
    }

    /// The cumulative `field` of `shard` at `t`, summed over processes
    /// (linear between readings; zero before the first, flat after the last).
    pub fn at(&self, shard: usize, field: Field, t: f64) -> f64 {
        self.procs
            .iter()
            .map(|p| interpolate(p, shard, field, t))
            .sum()
    }

    /// Mean rate of `field` on `shard` over `[a, b)`, per second.
    pub fn rate(&self, shard: usize, field: Field, a: f64, b: f64) -> f64 {
        if b <= a {
            return 0.0;
        }
        (self.at(shard, field, b) - self.at(shard, field, a)) / (b - a)
    }

    /// The first time (10 ms steps) at which `field` summed over `shards`
    /// reaches `target`; None if it never does.
    pub fn reach(&self, shards: &[usize], field: Field, target: f64) -> Option<f64> {
        let end = self.end();
        let mut t = 0.0;
        while t <= end + REACH_STEP_S {
            if shards.iter().map(|&s| self.at(s, field, t)).sum::<f64>() >= target {
                return Some(t);
            }
            t += REACH_STEP_S;
        }
        None
    }

    /// Per-second rates of every counter on every shard, `[k, k+1)` for each
    /// whole second up to the last reading.
    pub fn seconds(&self) -> Vec<Second> {
        let fields: [Field; 6] = [
            completed,
            claimed,
            |c| c.claims,
            |c| c.busy,
            |c| c.empty,
            |c| c.errors,
        ];
        let mut out = Vec::new();
        let mut k = 0.0;
        while k + 1.0 <= self.end() + 1e-9 {
            for shard in 0..self.shards {
                let r: Vec<f64> = fields
                    .iter()
                    .map(|f| self.rate(shard, *f, k, k + 1.0))
                    .collect();
                out.push(Second {
                    t: k,
                    shard,
                    completed: r[0],
                    claimed: r[1],
                    claims: r[2],
                    busy: r[3],
                    empty: r[4],
                    errors: r[5],
                });
            }
            k += 1.0;
        }
        out
    }
}

/// Rates of one shard over one second.
#[derive(Debug, Clone, Copy)]
pub struct Second {
    /// Start of the second (s since go).
    pub t: f64,
    /// Shard index.
    pub shard: usize,
    /// Outcomes written per second.
    pub completed: f64,
    /// Jobs claimed per second.
    pub claimed: f64,
    /// Claim statements that returned jobs, per second.
    pub claims: f64,
    /// Lock misses per second.
    pub busy: f64,
    /// Empty claims per second.
    pub empty: f64,
    /// Failed claims per second.
    pub errors: f64,
}

fn interpolate(p: &[(f64, Vec<ShardCountersSnapshot>)], shard: usize, field: Field, t: f64) -> f64 {
    let value = |i: usize| p[i].1.get(shard).map_or(0, field) as f64;
    let after = p.partition_point(|(ts, _)| *ts <= t);
    if after == 0 {
        return 0.0;
    }
    if after == p.len() {
        return value(p.len() - 1);
    }
    let (t0, t1) = (p[after - 1].0, p[after].0);
    let (v0, v1) = (value(after - 1), value(after));
    if t1 <= t0 {
        return v1;
    }
    v0 + (v1 - v0) * (t - t0) / (t1 - t0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ms: f64, completed: u64) -> Sample {
        Sample {
            unix_ms: ms,
            shards: vec![ShardCountersSnapshot {
                completed,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn rates_interpolate_and_sum_processes() {
        let a = vec![sample(1000.0, 0), sample(2000.0, 100), sample(3000.0, 300)];
        let b = vec![sample(1500.0, 50), sample(3000.0, 200)];
        let t = Timeline::new(&[a, b], 1000.0, 1);
        assert!((t.at(0, completed, 1.5) - (200.0 + 150.0)).abs() < 1e-9);
        assert!((t.rate(0, completed, 0.0, 2.0) - 250.0).abs() < 1e-9);
        assert_eq!(t.seconds().len(), 2);
        assert!((t.at(0, completed, 9.0) - 500.0).abs() < 1e-9);
        let half = t.reach(&[0], completed, 250.0).unwrap();
        assert!((1.16..1.18).contains(&half), "{half}");
        assert_eq!(t.reach(&[0], completed, 501.0), None);
    }
}
