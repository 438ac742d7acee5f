//! The SVG chart: throughput (drain, scale), write-path ratios and latency percentiles.
//! plotters' SVG backend only: text is left to the viewer's fonts, nothing is loaded here.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{fmt_num, Report, Row};

const WIDTH: u32 = 1100;
const PANEL: u32 = 340;
/// Width of the row names left of a bar chart.
const LABELS: u32 = 380;
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A horizontal bar chart's input: label, median, min, max.
type Bars = Vec<(String, f64, f64, f64)>;

pub fn write(report: &Report, path: &Path) -> anyhow::Result<()> {
    let mut throughput: Bars = Vec::new();
    let mut write_ratios: Bars = Vec::new();
    let mut latency: Vec<(String, [f64; 4])> = Vec::new();
    for s in &report.sections {
        for r in &s.rows {
            match s.scenario {
                "publish" => push_bar(&mut throughput, s.scenario, r, "messages_per_s"),
                "drain" | "scale" => push_bar(&mut throughput, s.scenario, r, "events_per_s"),
                "write" => push_bar(&mut write_ratios, "", r, "ratio"),
                "latency" => {
                    let p = |k: &str| r.stat(k).map_or(f64::NAN, |s| s.median);
                    latency.push((
                        r.config.clone(),
                        [p("p50_ms"), p("p90_ms"), p("p99_ms"), p("max_ms")],
                    ));
                }
                _ => {}
            }
        }
    }
    let panels = [
        !throughput.is_empty(),
        !write_ratios.is_empty(),
        !latency.is_empty(),
    ];
    let heights: Vec<u32> = [throughput.len(), write_ratios.len()]
        .iter()
        .map(|n| 90 + 26 * *n as u32)
        .chain([PANEL])
        .zip(panels)
        .filter_map(|(h, on)| on.then_some(h))
        .collect();
    if heights.is_empty() {
        anyhow::bail!("nothing to chart");
    }
    let total: u32 = heights.iter().sum();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, total)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut breaks = Vec::new();
        let mut y = 0;
        for h in &heights[..heights.len() - 1] {
            y += *h as i32;
            breaks.push(y);
        }
        let mut areas = root
            .split_by_breakpoints::<i32, i32, _, _>([], breaks)
            .into_iter();
        if !throughput.is_empty() {
            if let Some(area) = areas.next() {
                bars(
                    &area,
                    "Drain rate, events/s (publish: the broker alone, messages/s; median; line: min-max)",
                    &throughput,
                )?;
            }
        }
        if !write_ratios.is_empty() {
            if let Some(area) = areas.next() {
                bars(
                    &area,
                    "Write path: commits/s relative to no outbox (median; line: min-max)",
                    &write_ratios,
                )?;
            }
        }
        if !latency.is_empty() {
            if let Some(area) = areas.next() {
                percentiles(&area, &latency)?;
            }
        }
        root.present().map_err(plot_err)?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing the chart to {}", path.display()))
}

fn push_bar(out: &mut Bars, prefix: &str, r: &Row, key: &str) {
    if let Some(s) = r.stat(key) {
        let label = if prefix.is_empty() {
            r.config.clone()
        } else {
            format!("{prefix}: {}", r.config)
        };
        out.push((label, s.median, s.min, s.max));
    }
}

fn plot_err<E: std::error::Error + Send + Sync + 'static>(
    e: DrawingAreaErrorKind<E>,
) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    data: &Bars,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let max = data.iter().map(|d| d.3.max(d.1)).fold(0.0f64, f64::max);
    let max = if max.is_finite() && max > 0.0 {
        max * 1.15
    } else {
        1.0
    };
    let n = data.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(28)
        .y_label_area_size(LABELS)
        .build_cartesian_2d(0.0..max, 0.0..n)
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .light_line_style(WHITE)
        .label_style(("sans-serif", 12))
        .y_labels(2)
        .y_label_formatter(&|_| String::new())
        .x_label_formatter(&|v: &f64| fmt_num(*v))
        .draw()
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    // Row i (the first at the top) spans y from n-i-1 to n-i.
    let mid = |i: usize| n - i as f64 - 0.5;
    chart
        .draw_series(data.iter().enumerate().map(|(i, d)| {
            Rectangle::new(
                [(0.0, mid(i) - 0.35), (d.1, mid(i) + 0.35)],
                COLORS[0].mix(0.7).filled(),
            )
        }))
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    chart
        .draw_series(data.iter().enumerate().map(|(i, d)| {
            PathElement::new(vec![(d.2, mid(i)), (d.3, mid(i))], BLACK.stroke_width(2))
        }))
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    let left = TextStyle::from(("sans-serif", 12)).pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(data.iter().enumerate().map(|(i, d)| {
            Text::new(
                format!(" {}", fmt_num(d.1)),
                (d.3.max(d.1), mid(i)),
                left.clone(),
            )
        }))
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    // Row names in the label area, right-aligned against the axis.
    let right = TextStyle::from(("sans-serif", 12)).pos(Pos::new(HPos::Right, VPos::Center));
    let (bx, by) = area.get_base_pixel();
    for (i, d) in data.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(0.0, mid(i)));
        area.draw(&Text::new(d.0.clone(), (x - bx - 8, y - by), right.clone()))
            .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    }
    Ok(())
}

fn percentiles<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    data: &[(String, [f64; 4])],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    // Log scale: p50 and max can be orders of magnitude apart. The axis starts at half the
    // smallest value, at least 0.01 ms (smaller ones, clock noise, are drawn there).
    let floor = data
        .iter()
        .flat_map(|d| d.1)
        .filter(|v| v.is_finite())
        .fold(f64::INFINITY, f64::min);
    let floor = (floor * 0.5).clamp(0.01, 1.0);
    let max = data
        .iter()
        .flat_map(|d| d.1)
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.5;
    let labels = ["p50", "p90", "p99", "max"];
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Commit-to-ack latency, ms (log scale; median of runs)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d((0usize..3usize).into_segmented(), (floor..max).log_scale())
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .label_style(("sans-serif", 12))
        .x_labels(4)
        .x_label_formatter(&|v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).map(|s| s.to_string()).unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        })
        .y_label_formatter(&|v: &f64| fmt_num(*v))
        .draw()
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    for (k, (name, ps)) in data.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let points: Vec<(SegmentValue<usize>, f64)> = ps
            .iter()
            .enumerate()
            .map(|(i, v)| (SegmentValue::CenterOf(i), v.max(floor)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Row, RunResult, Section};

    fn row(name: &str, values: &[(&'static str, f64)]) -> Row {
        let runs: Vec<RunResult> = [1.0, 0.9, 1.1]
            .iter()
            .map(|k| {
                values
                    .iter()
                    .fold(RunResult::default(), |r, (key, v)| r.value(key, v * k))
            })
            .collect();
        Row::new(name.into(), serde_json::Value::Null, &runs)
    }

    fn section(scenario: &'static str, rows: Vec<Row>) -> Section {
        Section {
            scenario,
            measures: String::new(),
            columns: Vec::new(),
            rows,
        }
    }

    #[test]
    fn chart_has_every_panel_and_row_in_order() {
        let report = Report {
            txoutbox_version: "test",
            started_at: chrono::Utc::now(),
            postgres: "PostgreSQL".into(),
            cpus: 2,
            repeats: 3,
            sections: vec![
                section(
                    "drain",
                    vec![
                        row("first-drain", &[("events_per_s", 90_000.0)]),
                        row("second-drain", &[("events_per_s", 40_000.0)]),
                    ],
                ),
                section("write", vec![row("no outbox", &[("ratio", 1.0)])]),
                section(
                    "latency",
                    vec![row(
                        "500/s",
                        &[
                            ("p50_ms", 1.0),
                            ("p90_ms", 2.0),
                            ("p99_ms", 4.0),
                            ("max_ms", 9.0),
                        ],
                    )],
                ),
            ],
        };
        let path = std::env::temp_dir().join(format!("txo-chart-{}.svg", std::process::id()));
        write(&report, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        if std::env::var_os("KEEP_CHART").is_none() {
            let _ = std::fs::remove_file(&path);
        }
        for text in [
            "Drain rate",
            "Write path",
            "Commit-to-ack latency",
            "500/s",
            "90,000",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        let first = svg.find("drain: first-drain").unwrap();
        let second = svg.find("drain: second-drain").unwrap();
        // The first row is drawn at the top: lower y in the SVG.
        let y = |at: usize| -> f64 {
            let tag = svg[..at].rfind("<text").unwrap();
            let y = svg[tag..].split("y=\"").nth(1).unwrap();
            y[..y.find('"').unwrap()].parse().unwrap()
        };
        assert!(y(first) < y(second), "rows out of order");
    }
}
