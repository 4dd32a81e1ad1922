//! Line charts as SVG (plotters' SVG backend: no font files or image codecs to build; viewers
//! render the text).

use std::path::Path;

use plotters::prelude::*;

/// Draw `curves` (name, points) into an SVG file at `path`, y from 0 to a round bound above the data.
pub fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    curves: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let points = || curves.iter().flat_map(|(_, p)| p.iter());
    let y_max = points().fold(0f64, |m, &(_, y)| m.max(y));
    let y_top = ((y_max / 10.0).ceil() * 10.0).max(10.0);
    let (x_lo, x_hi) = points().fold((f64::MAX, f64::MIN), |(lo, hi), &(x, _)| (lo.min(x), hi.max(x)));
    let (x_lo, x_hi) = if x_lo < x_hi { (x_lo.min(0.0), x_hi) } else { (0.0, 1.0) };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x_lo..x_hi, 0f64..y_top)?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
    for (i, (name, pts)) in curves.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// `points` of a quantity that holds its value until the next point (a utilisation after each
/// event, an empirical CDF) as the corners of a step line: joining the points straight would show
/// gradual change where there is none.
pub fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        assert_eq!(super::steps(&[]), []);
        assert_eq!(super::steps(&[(0.0, 1.0)]), [(0.0, 1.0)]);
        assert_eq!(
            super::steps(&[(0.0, 100.0), (2.0, 50.0), (5.0, 0.0)]),
            [(0.0, 100.0), (2.0, 100.0), (2.0, 50.0), (5.0, 50.0), (5.0, 0.0)]
        );
    }
}
