//! What both charts (`memplug demo --plot`, `memplug node demo --plot`)
//! draw with: plotters' SVG backend into a string, one font, byte figures
//! in MiB.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::error::Error;

/// The font of every label.
pub(crate) const FONT: &str = "sans-serif";

/// The area a chart draws on.
pub(crate) type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// `bytes` in MiB, for an axis.
pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// The SVG document `draw` paints on a white-less canvas of `size` pixels
/// (each chart fills its own background).
pub(crate) fn svg(
    size: (u32, u32),
    draw: impl FnOnce(&Area<'_>) -> Result<(), Box<dyn Error>>,
) -> Result<String, String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, size).into_drawing_area();
        draw(&root).map_err(|e| format!("drawing the chart: {e}"))?;
        root.present().map_err(|e| format!("drawing the chart: {e}"))?;
    }
    Ok(buf)
}
