//! A start rate as the command line writes it (`--rate 100/s`).

use shardq::client::StartRate;
use std::time::Duration;

/// `N/s`, `N/min`, `N/h`, `N/<D>s`, `N/<D>ms`.
pub fn parse_rate(text: &str) -> Result<StartRate, String> {
    let bad = || format!("`{text}`: give N/PERIOD, e.g. 100/s, 1000/min, 5/h, 10/500ms");
    let (count, per) = text.split_once('/').ok_or_else(bad)?;
    let count: u32 = count.trim().parse().map_err(|_| bad())?;
    let per = per.trim();
    let ms: u64 = match per {
        "s" | "sec" | "second" => 1_000,
        "m" | "min" | "minute" => 60_000,
        "h" | "hour" => 3_600_000,
        _ => {
            let (digits, unit) =
                per.split_at(per.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
            let n: u64 = digits.parse().map_err(|_| bad())?;
            match unit {
                "ms" => n,
                "s" => n * 1_000,
                "min" => n * 60_000,
                _ => return Err(bad()),
            }
        }
    };
    if count == 0 || ms == 0 {
        return Err(format!(
            "`{text}`: a rate needs a count and a period above 0"
        ));
    }
    Ok(StartRate {
        count,
        per: Duration::from_millis(ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_their_units_and_bad_ones_say_what_to_give() {
        let ms = |t: &str| parse_rate(t).map(|r| (r.count, r.per.as_millis()));
        assert_eq!(ms("100/s"), Ok((100, 1_000)));
        assert_eq!(ms("1000/min"), Ok((1000, 60_000)));
        assert_eq!(ms("5/h"), Ok((5, 3_600_000)));
        assert_eq!(ms("10/500ms"), Ok((10, 500)));
        assert_eq!(ms("3/2s"), Ok((3, 2_000)));
        for bad in ["100", "x/s", "10/fortnight", "0/s", "5/0ms"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert!(parse_rate("10/week").unwrap_err().contains("100/s"));
    }
}
