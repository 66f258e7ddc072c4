//! What the dashboard's timing examples share.

use std::time::{Duration, Instant};

/// The median of 5 requests of `url`, each of which must succeed.
pub async fn median(http: &reqwest::Client, url: &str) -> anyhow::Result<Duration> {
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let response = http.get(url).send().await?;
        anyhow::ensure!(
            response.status().is_success(),
            "{url}: {}",
            response.status()
        );
        response.text().await?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok(times[2])
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
