//! Results: per configuration, every run's figures and their median, min and max; printed as a
//! table or one JSON document.

use std::fmt::Write as _;

use serde::Serialize;

/// What one run measured, in column order.
#[derive(Debug, Default, Clone)]
pub struct RunResult {
    pub values: Vec<(&'static str, f64)>,
    pub flags: Vec<(&'static str, bool)>,
}

impl RunResult {
    pub fn value(mut self, key: &'static str, v: f64) -> Self {
        self.values.push((key, v));
        self
    }
    pub fn flag(mut self, key: &'static str, v: bool) -> Self {
        self.flags.push((key, v));
        self
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

impl Stat {
    pub fn of(runs: Vec<f64>) -> Self {
        let mut s = runs.clone();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => s[n / 2],
            _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        };
        Self {
            median,
            min: s.first().copied().unwrap_or(f64::NAN),
            max: s.last().copied().unwrap_or(f64::NAN),
            runs,
        }
    }
}

/// A column of a section's table.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Column {
    pub key: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
}

pub const fn col(key: &'static str, label: &'static str, unit: &'static str) -> Column {
    Column { key, label, unit }
}

/// One configuration's runs.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub config: String,
    pub params: serde_json::Value,
    /// key -> statistics, in column order.
    pub metrics: Vec<(String, Stat)>,
    /// key -> the value of each run (e.g. whether it kept up).
    pub flags: Vec<(String, Vec<bool>)>,
}

impl Row {
    pub fn new(config: String, params: serde_json::Value, runs: &[RunResult]) -> Self {
        let mut metrics: Vec<(String, Vec<f64>)> = Vec::new();
        let mut flags: Vec<(String, Vec<bool>)> = Vec::new();
        for r in runs {
            for (k, v) in &r.values {
                match metrics.iter_mut().find(|(key, _)| key == k) {
                    Some((_, vs)) => vs.push(*v),
                    None => metrics.push((k.to_string(), vec![*v])),
                }
            }
            for (k, v) in &r.flags {
                match flags.iter_mut().find(|(key, _)| key == k) {
                    Some((_, vs)) => vs.push(*v),
                    None => flags.push((k.to_string(), vec![*v])),
                }
            }
        }
        Self {
            config,
            params,
            metrics: metrics.into_iter().map(|(k, v)| (k, Stat::of(v))).collect(),
            flags,
        }
    }

    pub fn stat(&self, key: &str) -> Option<&Stat> {
        self.metrics.iter().find(|(k, _)| k == key).map(|(_, s)| s)
    }

    pub fn add_metric(&mut self, key: &str, runs: Vec<f64>) {
        self.metrics.push((key.to_string(), Stat::of(runs)));
    }
}

/// With more than one source (`--source table,wal`): each row's `metric` divided by that of
/// the row with the same parameters but `"source": "table"`, run by run (runs are
/// interleaved, so run i of every configuration shares round i), as `key`. Rows without such
/// a partner get no ratio; the table rows that have one get 1.
pub fn add_ratio_to_table(rows: &mut [Row], metric: &str, key: &str) {
    add_ratio_to(rows, metric, key, "source", "table");
}

/// With `--baseline-bin`: each row's `metric` divided by that of the same configuration run by
/// the baseline build, run by run, as `key` (the baseline rows get 1).
pub fn add_ratio_to_baseline(rows: &mut [Row], metric: &str, key: &str) {
    add_ratio_to(rows, metric, key, "build", "baseline");
}

/// Each row's `metric` over that of its partner: the row whose parameters are the same but
/// for `param`, which is `base` there.
fn add_ratio_to(rows: &mut [Row], metric: &str, key: &str, param: &str, base: &str) {
    let without_param = |r: &Row| {
        let mut p = r.params.clone();
        if let Some(o) = p.as_object_mut() {
            o.remove(param);
        }
        p
    };
    let is_base = |r: &Row| r.params.get(param).and_then(|s| s.as_str()) == Some(base);
    let mut ratios: Vec<(usize, Vec<f64>)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        if is_base(r) {
            continue;
        }
        let params = without_param(r);
        let Some(partner) = rows
            .iter()
            .position(|b| is_base(b) && without_param(b) == params)
        else {
            continue;
        };
        let (Some(v), Some(b)) = (r.stat(metric), rows[partner].stat(metric)) else {
            continue;
        };
        ratios.push((i, v.runs.iter().zip(&b.runs).map(|(v, b)| v / b).collect()));
        if !ratios.iter().any(|(j, _)| *j == partner) {
            ratios.push((partner, vec![1.0; b.runs.len()]));
        }
    }
    for (i, runs) in ratios {
        rows[i].add_metric(key, runs);
    }
}

/// One scenario's results.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    pub scenario: &'static str,
    /// What is measured and how, for the reader of the table.
    pub measures: String,
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub txoutbox_version: &'static str,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub postgres: String,
    pub cpus: usize,
    pub repeats: u32,
    pub sections: Vec<Section>,
}

impl Report {
    pub fn json(&self) -> anyhow::Result<String> {
        // Metrics as objects keyed by name (serde would make them pairs).
        let mut v = serde_json::to_value(self)?;
        if let Some(sections) = v.get_mut("sections").and_then(|s| s.as_array_mut()) {
            for s in sections {
                if let Some(rows) = s.get_mut("rows").and_then(|r| r.as_array_mut()) {
                    for r in rows {
                        for field in ["metrics", "flags"] {
                            if let Some(pairs) = r.get(field).and_then(|m| m.as_array()) {
                                let obj: serde_json::Map<String, serde_json::Value> = pairs
                                    .iter()
                                    .filter_map(|p| {
                                        let k = p.get(0)?.as_str()?.to_string();
                                        Some((k, p.get(1)?.clone()))
                                    })
                                    .collect();
                                r[field] = serde_json::Value::Object(obj);
                            }
                        }
                    }
                }
            }
        }
        Ok(serde_json::to_string_pretty(&v)?)
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "txoutbox {} bench, {}, {} CPUs, {} run(s) per configuration, interleaved; \
             figures: median (min-max)",
            self.txoutbox_version, self.postgres, self.cpus, self.repeats
        );
        for s in &self.sections {
            let _ = writeln!(out, "\n== {} ==\n{}", s.scenario, s.measures);
            // A column no row has (e.g. the ratio to table of a one-source run) is left out.
            let columns: Vec<&Column> = s
                .columns
                .iter()
                .filter(|c| s.rows.iter().any(|r| r.stat(c.key).is_some()))
                .collect();
            let mut header = vec!["configuration".to_string()];
            header.extend(columns.iter().map(|c| {
                if c.unit.is_empty() {
                    c.label.to_string()
                } else {
                    format!("{} ({})", c.label, c.unit)
                }
            }));
            let flag_keys: Vec<&String> = s
                .rows
                .first()
                .map(|r| r.flags.iter().map(|(k, _)| k).collect())
                .unwrap_or_default();
            header.extend(flag_keys.iter().map(|k| k.to_string()));
            let mut lines = vec![header];
            for r in &s.rows {
                let mut line = vec![r.config.clone()];
                for c in &columns {
                    line.push(match r.stat(c.key) {
                        Some(st) => fmt_stat(st),
                        None => "-".into(),
                    });
                }
                for (_, vs) in &r.flags {
                    let yes = vs.iter().filter(|b| **b).count();
                    line.push(format!("{yes}/{} yes", vs.len()));
                }
                lines.push(line);
            }
            let widths: Vec<usize> = (0..lines[0].len())
                .map(|i| {
                    lines
                        .iter()
                        .map(|l| l.get(i).map_or(0, |c| c.chars().count()))
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            for (n, l) in lines.iter().enumerate() {
                let cells: Vec<String> = l
                    .iter()
                    .enumerate()
                    .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
                    .collect();
                let _ = writeln!(out, "{}", cells.join("  ").trim_end());
                if n == 0 {
                    let total = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
                    let _ = writeln!(out, "{}", "-".repeat(total));
                }
            }
        }
        out
    }
}

fn fmt_stat(s: &Stat) -> String {
    if s.runs.len() == 1 {
        fmt_num(s.median)
    } else {
        format!(
            "{} ({}-{})",
            fmt_num(s.median),
            fmt_num(s.min),
            fmt_num(s.max)
        )
    }
}

/// 3 significant digits for small numbers, thousands separators for large ones.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let n = v.round() as i64;
        let digits = n.unsigned_abs().to_string();
        let mut s = String::new();
        for (i, ch) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                s.push(',');
            }
            s.push(ch);
        }
        if n < 0 {
            s.insert(0, '-');
        }
        s
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The `p`-quantile (0..=1) of sorted values, nearest rank.
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let s = Stat::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Stat::of(vec![4.0, 1.0]).median, 2.5);
    }

    #[test]
    fn quantiles_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.9), 7.0);
    }

    fn row(source: &str, publisher: &str, runs: &[f64]) -> Row {
        let results: Vec<RunResult> = runs
            .iter()
            .map(|v| RunResult::default().value("events_per_s", *v))
            .collect();
        Row::new(
            format!("{source} -> {publisher}"),
            serde_json::json!({ "publisher": publisher, "source": source }),
            &results,
        )
    }

    #[test]
    fn ratio_to_the_table_row_of_the_same_configuration_round_by_round() {
        let mut rows = vec![
            row("table", "null:", &[100.0, 200.0]),
            row("wal", "null:", &[300.0, 200.0]),
            row("table", "nats:", &[50.0, 50.0]),
            row("wal", "nats:", &[25.0, 100.0]),
        ];
        add_ratio_to_table(&mut rows, "events_per_s", "ratio");
        let ratio = |r: &Row| r.stat("ratio").map(|s| s.runs.clone());
        assert_eq!(ratio(&rows[0]), Some(vec![1.0, 1.0]));
        assert_eq!(ratio(&rows[1]), Some(vec![3.0, 1.0]));
        assert_eq!(ratio(&rows[2]), Some(vec![1.0, 1.0]));
        assert_eq!(ratio(&rows[3]), Some(vec![0.5, 2.0]));
        // One source only: no ratio column at all.
        let mut alone = vec![row("table", "null:", &[1.0])];
        add_ratio_to_table(&mut alone, "events_per_s", "ratio");
        assert!(alone[0].stat("ratio").is_none());
    }

    #[test]
    fn ratio_to_the_baseline_build_of_the_same_configuration_and_source() {
        let with_build = |source: &str, build: &str, runs: &[f64]| {
            let mut r = row(source, "null:", runs);
            r.params["build"] = serde_json::json!(build);
            r
        };
        let mut rows = vec![
            with_build("table", "current", &[120.0, 90.0]),
            with_build("table", "baseline", &[100.0, 100.0]),
            with_build("wal", "current", &[300.0, 300.0]),
            with_build("wal", "baseline", &[150.0, 200.0]),
        ];
        add_ratio_to_table(&mut rows, "events_per_s", "to_table");
        add_ratio_to_baseline(&mut rows, "events_per_s", "to_baseline");
        let ratio = |r: &Row, k: &str| r.stat(k).map(|s| s.runs.clone());
        assert_eq!(ratio(&rows[0], "to_baseline"), Some(vec![1.2, 0.9]));
        assert_eq!(ratio(&rows[1], "to_baseline"), Some(vec![1.0, 1.0]));
        assert_eq!(ratio(&rows[2], "to_baseline"), Some(vec![2.0, 1.5]));
        // The source ratio pairs each build with its own table row.
        assert_eq!(ratio(&rows[2], "to_table"), Some(vec![2.5, 300.0 / 90.0]));
        assert_eq!(ratio(&rows[3], "to_table"), Some(vec![1.5, 2.0]));
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(123_456.7), "123,457");
        assert_eq!(fmt_num(12.345), "12.3");
        assert_eq!(fmt_num(0.5), "0.50");
    }
}
