//! The SVG chart: throughput (drain, scale), write-path ratios and latency percentiles.
//! plotters' SVG backend only: text is left to the viewer's fonts, nothing is loaded here.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use super::report::{fmt_num, Report, Row};

const WIDTH: u32 = 1100;
const PANEL: u32 = 340;
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
                    "Drain rate, events/s (median; line: min-max)",
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
    let n = data.len();
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(28)
        .y_label_area_size(400)
        .build_cartesian_2d(0.0..max, (0..n).into_segmented())
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => data.get(*i).map(|d| d.0.clone()).unwrap_or_default(),
            _ => String::new(),
        })
        .x_label_formatter(&|v: &f64| fmt_num(*v))
        .draw()
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    let seg = |i: usize| SegmentValue::<usize>::Exact(i);
    chart
        .draw_series(data.iter().enumerate().map(|(i, d)| {
            let mut r = Rectangle::new(
                [(0.0, seg(i)), (d.1, seg(i + 1))],
                COLORS[0].mix(0.7).filled(),
            );
            r.set_margin(4, 4, 0, 0);
            r
        }))
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    chart
        .draw_series(data.iter().enumerate().map(|(i, d)| {
            PathElement::new(
                vec![
                    (d.2, SegmentValue::CenterOf(i)),
                    (d.3, SegmentValue::CenterOf(i)),
                ],
                BLACK.stroke_width(2),
            )
        }))
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    chart
        .draw_series(data.iter().enumerate().map(|(i, d)| {
            Text::new(
                format!(" {}", fmt_num(d.1)),
                (d.3.max(d.1), SegmentValue::CenterOf(i)),
                ("sans-serif", 12),
            )
        }))
        .map_err(|e| anyhow::anyhow!("drawing the chart: {e}"))?;
    Ok(())
}

fn percentiles<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    data: &[(String, [f64; 4])],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    // Log scale: p50 and max can be orders of magnitude apart. Values below 0.01 ms
    // (clock noise) are drawn at 0.01.
    let floor = 0.01f64;
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
