//! `memplug node demo --plot FILE.svg`: the budget of two processes over
//! time — what the node leases in all, to the server and to the trainer,
//! the server's use, its experts on the device and their host copies —
//! with the node's capacity and the demo's events marked. Drawn with
//! plotters' SVG backend, as `memplug demo --plot`.

use crate::chart::{mib, Area, FONT};
use crate::node_demo::{Event, Sample};
use plotters::prelude::*;

const SIZE: (u32, u32) = (1280, 600);

/// The chart as an SVG document.
pub fn svg(samples: &[Sample], events: &[Event], capacity: u64) -> Result<String, String> {
    crate::chart::svg(SIZE, |root| draw(root, samples, events, capacity))
}

/// A line: its legend, its colour, and the figure of a sample it draws.
type Series = (&'static str, RGBColor, fn(&Sample) -> u64);

fn draw(
    root: &Area<'_>,
    samples: &[Sample],
    events: &[Event],
    capacity: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let t_end = samples.last().map_or(1.0, |s| s.ms).max(events.last().map_or(1.0, |e| e.ms)) * 1.02;
    let y_max = (mib(capacity) * 1.2).ceil();
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!(
                "memplug node demo: an inference server and a trainer on one {:.0} MiB budget",
                mib(capacity)
            ),
            (FONT, 20),
        )
        .margin(16)
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
        .draw()?;
    let series: [Series; 6] = [
        ("node: leased in all", RGBColor(40, 40, 40), |s| s.node_leased),
        ("server: leased", RGBColor(31, 119, 180), |s| s.server_leased),
        ("server: used", RGBColor(174, 199, 232), |s| s.server_used),
        ("server: experts on the device", RGBColor(44, 160, 44), |s| s.experts_device),
        ("server: experts' host copies", RGBColor(23, 190, 207), |s| s.host_copies),
        ("trainer: leased", RGBColor(255, 127, 14), |s| s.trainer_leased),
    ];
    for (name, colour, value) in series {
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.ms, mib(value(s)))),
                colour.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(3)));
    }
    let cap = mib(capacity);
    chart
        .draw_series(DashedLineSeries::new(
            vec![(0.0, cap), (t_end, cap)],
            8,
            5,
            RGBColor(214, 39, 40).stroke_width(2),
        ))?
        .label("node: capacity")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RGBColor(214, 39, 40).stroke_width(2)));
    // Offloads, restores and the trainer's steps, marked on the time axis.
    let grey = RGBColor(110, 110, 110);
    chart.draw_series(
        events.iter().filter(|e| e.what.contains("offloaded") || e.what.contains("restored")).map(|e| {
            let c = if e.what.contains("restored") { RGBColor(44, 160, 44) } else { RGBColor(148, 103, 189) };
            TriangleMarker::new((e.ms, y_max * 0.03), 7, c.filled())
        }),
    )?;
    chart.draw_series(
        events
            .iter()
            .filter(|e| e.who == "trainer")
            .map(|e| Circle::new((e.ms, y_max * 0.97), 4, grey.filled())),
    )?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(grey)
        .label_font((FONT, 14))
        .draw()?;
    Ok(())
}
