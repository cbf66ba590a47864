//! `memplug demo --plot FILE.svg`: the pool's use per allocation class over
//! the demo's timeline, as the governor charged it after each event, with
//! the pool's capacity, the pressure tickets, evictions, the OutOfBudget,
//! the offload, restore and copy-on-write and the device loss marked, the
//! kernel's resident figures at each measurement (pagemap per class, the
//! process's smaps delta less the host copies) and the story's scenes as
//! numbered bands. Drawn with plotters' SVG backend.
//!
//! The budget drawn is the device pool's. The offload's host copies are
//! charged to a pool of their own (the host pool): they are drawn apart,
//! in their own colour, and left out of the process's delta, so that the
//! device pool's figures never read as a breach of its capacity.

use super::report::Report;
use super::timeline::Event;
use crate::chart::{mib, FONT};
use memplug_host::governor::AllocationClass;
use plotters::coord::Shift;
use plotters::prelude::*;

const SIZE: (u32, u32) = (1280, 640);
/// Room right of the plotting area for the legend.
const LEGEND_WIDTH: u32 = 360;

/// The colour of a class's line and of its kernel figure.
fn class_colour(class: AllocationClass) -> RGBColor {
    match class {
        AllocationClass::Weights => RGBColor(31, 119, 180),
        AllocationClass::Kv => RGBColor(255, 127, 14),
        AllocationClass::Activations => RGBColor(44, 160, 44),
        AllocationClass::Workspace => RGBColor(148, 103, 189),
        AllocationClass::Other => RGBColor(140, 86, 75),
    }
}

const CAPACITY: RGBColor = RGBColor(214, 39, 40);
const MARKS: RGBColor = RGBColor(110, 110, 110);
/// The host pool (offloaded copies) and the moves between the pools.
const HOST: RGBColor = RGBColor(23, 190, 207);
/// Copy-on-write.
const PRIVATISE: RGBColor = RGBColor(227, 119, 194);

type Svg<'a> = SVGBackend<'a>;
/// A series' points: (ms, MiB).
type Points = Vec<(f64, f64)>;

/// How a series is drawn: its points on the chart and its sample in the
/// legend, from one description.
#[derive(Clone, Copy)]
enum Mark {
    /// A line of this width.
    Line(RGBColor, u32),
    /// A dashed line.
    Dashed(RGBColor),
    /// A vertical rule across the chart.
    Rule(RGBColor),
    Triangle(RGBColor, i32),
    Cross(RGBColor, i32, u32),
    Dot(RGBColor, i32),
    Ring(RGBColor, i32),
    /// A square, filled or not.
    Square(RGBColor, i32, bool),
}

impl Mark {
    /// The mark at `at` (a point mark; a line's sample is a short line).
    fn at<'b, C: Clone + 'static>(self, at: C) -> DynElement<'static, Svg<'b>, C> {
        match self {
            Mark::Triangle(c, size) => TriangleMarker::new(at, size, c.filled()).into_dyn(),
            Mark::Cross(c, size, w) => Cross::new(at, size, c.stroke_width(w)).into_dyn(),
            Mark::Dot(c, size) => Circle::new(at, size, c.filled()).into_dyn(),
            Mark::Ring(c, size) => Circle::new(at, size, c.stroke_width(1)).into_dyn(),
            // Squares are drawn by `square` (a composed element); lines by
            // their series.
            Mark::Line(c, _) | Mark::Dashed(c) | Mark::Rule(c) | Mark::Square(c, ..) => {
                Circle::new(at, 0, c.filled()).into_dyn()
            }
        }
    }

    /// Its sample in the legend, centred at pixel `(x, y)`.
    fn sample<'b>(self, (x, y): (i32, i32)) -> Vec<DynElement<'static, Svg<'b>, (i32, i32)>> {
        let segment = |from: i32, to: i32, c: RGBColor, w: u32| {
            PathElement::new([(x + from, y), (x + to, y)], c.stroke_width(w)).into_dyn()
        };
        match self {
            Mark::Line(c, w) => vec![segment(-12, 12, c, w)],
            Mark::Dashed(c) => vec![segment(-12, -3, c, 2), segment(3, 12, c, 2)],
            Mark::Rule(c) => vec![PathElement::new([(x, y - 8), (x, y + 8)], c.stroke_width(1)).into_dyn()],
            Mark::Square(c, size, filled) => {
                vec![Rectangle::new([(x - size, y - size), (x + size, y + size)], square_style(c, filled))
                    .into_dyn()]
            }
            m => vec![m.at((x, y))],
        }
    }
}

fn square_style(c: RGBColor, filled: bool) -> ShapeStyle {
    if filled {
        c.filled()
    } else {
        c.stroke_width(2)
    }
}

/// The chart of `r` as an SVG document.
pub(super) fn svg(r: &Report) -> Result<String, String> {
    crate::chart::svg(SIZE, |root| draw(root, r))
}

/// One `(t, value)` step line: the value holds from one event to the next.
fn steps(events: &[Event], value: impl Fn(&Event) -> f64) -> Vec<(f64, f64)> {
    let mut pts = Vec::with_capacity(events.len() * 2);
    let mut last = None;
    for e in events {
        let v = value(e);
        if let Some(prev) = last {
            pts.push((e.t_ms, prev));
        }
        pts.push((e.t_ms, v));
        last = Some(v);
    }
    pts
}

/// The events of `kind`, placed at the pool's use after them.
fn marks(r: &Report, kind: &str) -> Vec<(f64, f64)> {
    r.timeline.iter().filter(|e| e.kind == kind).map(|e| (e.t_ms, mib(e.pool_used))).collect()
}

fn draw(root: &DrawingArea<Svg<'_>, Shift>, r: &Report) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let t_end = r.timeline.last().map_or(1.0, |e| e.t_ms).max(1.0) * 1.01;
    let capacity = mib(r.scenario.pool_capacity);
    // Room above the capacity line for the scene numbers.
    let y_max = (capacity * 1.15).ceil();
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!(
                "memplug demo: pool use per allocation class under a hard {capacity} MiB budget \
                 (governor vs kernel)"
            ),
            (FONT, 20),
        )
        .margin(16)
        .margin_right(LEGEND_WIDTH)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..t_end, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("ms since the demo started")
        .y_desc("MiB")
        .light_line_style(RGBColor(238, 238, 238))
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;

    // The scenes: alternate bands, each numbered at the top (staggered in
    // two rows: the first scenes last a few milliseconds).
    chart.draw_series(
        r.scenes.iter().skip(1).step_by(2).map(|s| {
            Rectangle::new([(s.start_ms, 0.0), (s.end_ms, y_max)], RGBColor(244, 244, 244).filled())
        }),
    )?;
    chart.draw_series(r.scenes.iter().enumerate().map(|(i, s)| {
        let y = y_max * if i % 2 == 0 { 0.99 } else { 0.955 };
        Text::new(format!("{}", s.step), (s.start_ms, y), (FONT, 16).into_font().color(&MARKS))
    }))?;

    // Every series drawn, with its mark, for the legend.
    let mut legend: Vec<(String, Mark)> = Vec::new();
    let mut line =
        |chart: &mut ChartContext<'_, Svg<'_>, _>, name: String, mark: Mark, pts: Vec<(f64, f64)>| {
            let style = match mark {
                Mark::Line(c, w) => c.stroke_width(w),
                _ => BLACK.stroke_width(1),
            };
            let drawn = match mark {
                Mark::Dashed(c) => {
                    chart.draw_series(DashedLineSeries::new(pts, 8, 5, c.stroke_width(2))).map(|_| ())
                }
                _ => chart.draw_series(LineSeries::new(pts, style)).map(|_| ()),
            };
            legend.push((name, mark));
            drawn
        };

    // The governor's figures: each class that held anything, the pool in
    // all, and the capacity.
    let used = |e: &Event, class: AllocationClass| e.class_used.get(class.name()).copied().unwrap_or(0);
    let classes: Vec<AllocationClass> =
        AllocationClass::ALL.into_iter().filter(|&c| r.timeline.iter().any(|e| used(e, c) != 0)).collect();
    for &class in &classes {
        let pts = steps(&r.timeline, |e| mib(used(e, class)));
        line(
            &mut chart,
            format!("{} (governor: charged)", class.name()),
            Mark::Line(class_colour(class), 2),
            pts,
        )?;
    }
    line(
        &mut chart,
        "pool used (governor)".into(),
        Mark::Line(BLACK, 1),
        steps(&r.timeline, |e| mib(e.pool_used)),
    )?;
    let cap = vec![(0.0, capacity), (t_end, capacity)];
    line(&mut chart, format!("pool capacity ({capacity} MiB)"), Mark::Dashed(CAPACITY), cap)?;

    // What happened: tickets, evictions, the refusal, the loss; then the
    // kernel at each measurement: pages present per class (pagemap), on
    // the class's line, and the process's resident delta (smaps).
    let ms = &r.measurements;
    let resident = |class: AllocationClass| -> Vec<(f64, f64)> {
        ms.iter()
            .filter_map(|m| match class {
                AllocationClass::Weights => m.resident_weights.map(|b| (m.t_ms, mib(b))),
                AllocationClass::Kv => m.resident_kv.map(|b| (m.t_ms, mib(b))),
                _ => None,
            })
            .collect()
    };
    let mut points: Vec<(String, Mark, Points)> = vec![
        ("pressure ticket".into(), Mark::Triangle(MARKS, 6), marks(r, "ticket")),
        ("eviction".into(), Mark::Cross(BLACK, 5, 2), marks(r, "evict")),
        ("OutOfBudget".into(), Mark::Cross(CAPACITY, 8, 3), marks(r, "out_of_budget")),
        ("offloaded to the host pool".into(), Mark::Square(HOST, 5, true), marks(r, "offload")),
        ("restored at its address".into(), Mark::Square(HOST, 5, false), marks(r, "restore")),
        ("copy-on-write (privatise)".into(), Mark::Square(PRIVATISE, 5, true), marks(r, "privatise")),
        ("device lost".into(), Mark::Rule(CAPACITY), marks(r, "lost")),
    ];
    for &class in &classes {
        let pts = resident(class);
        if !pts.is_empty() {
            points.push((
                format!("{} resident (kernel: pagemap)", class.name()),
                Mark::Dot(class_colour(class), 5),
                pts,
            ));
        }
    }
    // The process's delta holds the host copies too: they are the host
    // pool's, drawn apart below, so the ring is the delta without them.
    points.push((
        "process resident Δ, less host copies (kernel)".into(),
        Mark::Ring(BLACK, 8),
        ms.iter()
            .filter_map(|m| {
                let host = m.resident_host.unwrap_or(0) as i64;
                m.process_delta.map(|d| (m.t_ms, mib((d - host).max(0) as u64)))
            })
            .collect(),
    ));
    if ms.iter().any(|m| m.governor_host != 0) {
        points.push((
            "host pool: charged (another pool, not this budget)".into(),
            Mark::Dot(HOST, 5),
            ms.iter().filter(|m| m.governor_host != 0).map(|m| (m.t_ms, mib(m.governor_host))).collect(),
        ));
    }
    if ms.iter().any(|m| m.stranded != 0) {
        points.push((
            "stranded by the loss, uncharged (kernel)".into(),
            Mark::Dot(MARKS, 5),
            ms.iter()
                .filter(|m| m.stranded != 0)
                .filter_map(|m| m.resident_stranded.map(|b| (m.t_ms, mib(b))))
                .collect(),
        ));
    }
    for (name, mark, pts) in points {
        match mark {
            Mark::Rule(c) => {
                chart.draw_series(
                    pts.into_iter().map(|(t, _)| PathElement::new([(t, 0.0), (t, y_max)], c.stroke_width(1))),
                )?;
            }
            Mark::Square(c, size, filled) => {
                chart.draw_series(pts.into_iter().map(|p| {
                    EmptyElement::at(p)
                        + Rectangle::new([(-size, -size), (size, size)], square_style(c, filled))
                }))?;
            }
            _ => {
                chart.draw_series(pts.into_iter().map(|p| mark.at(p)))?;
            }
        }
        legend.push((name, mark));
    }

    // The legend right of the plotting area, where it hides no data, and
    // under it the key to the scene numbers.
    let x0 = (SIZE.0 - LEGEND_WIDTH) as i32 + 16;
    let mut y = 60;
    for (name, mark) in &legend {
        for e in mark.sample((x0 + 12, y)) {
            root.draw(&e)?;
        }
        root.draw(&Text::new(name.as_str(), (x0 + 32, y - 8), (FONT, 15).into_font().color(&BLACK)))?;
        y += 22;
    }
    y += 18;
    root.draw(&Text::new("scenes", (x0, y), (FONT, 16).into_font().color(&BLACK)))?;
    for s in &r.scenes {
        y += 20;
        let text = format!("{} {}", s.step, s.title);
        root.draw(&Text::new(text, (x0, y), (FONT, 14).into_font().color(&MARKS)))?;
    }
    Ok(())
}
