//! v2's `min_capacity_ratio`: a fit arm's operating point (`replay --search`, campaign.json's
//! `operating_points`) over the reference's, per case. Each knee is only known to lie
//! between its last passing load and its first failing one (no pass: 0; no fail: no upper
//! end), so the ratio lies in [pass_arm / fail_ref, fail_arm / pass_ref]. The gate passes a
//! case when that whole range is at or above the threshold, fails it when the range lies
//! below, and has nothing to read otherwise (a narrower bracket would decide).

use super::doc::campaign::OperatingPoint;
use super::doc::verdict::{ArmGate, GateLevel};
use super::gates::{ArmView, Compared, NothingToRead, all3, arm_gate, ge};

/// The capacity ratio's range for one case: `(low, high)`, `high` `None` when unbounded.
pub(super) fn ratio_range(arm: &OperatingPoint, reference: &OperatingPoint) -> (f64, Option<f64>) {
    let (pa, fa) = (arm.last_pass.unwrap_or(0.0), arm.first_fail);
    let (pr, fr) = (reference.last_pass.unwrap_or(0.0), reference.first_fail);
    let low = match fr {
        Some(f) if f > 0.0 => pa / f,
        _ => 0.0,
    };
    let high = match fa {
        Some(f) if pr > 0.0 => Some(f / pr),
        _ => None,
    };
    (low, high)
}

/// The gate for `arm` against `reference`'s operating points.
pub(super) fn capacity_gate(
    arm: &ArmView<'_>,
    reference: &str,
    points: &[OperatingPoint],
    min: f64,
) -> ArmGate {
    arm_gate(arm, || {
        let mine: Vec<&OperatingPoint> = points.iter().filter(|p| p.arm == arm.name).collect();
        if mine.is_empty() {
            return Err(NothingToRead(
                "no operating point: run the campaign with replay --search concurrency --slo ..."
                    .into(),
            ));
        }
        let mut notes = Vec::new();
        let mut levels = Vec::new();
        for p in mine {
            let Some(r) = points
                .iter()
                .find(|r| r.arm == reference && r.case == p.case)
            else {
                notes.push(format!("{}: the reference has no operating point", p.case));
                levels.push(level(p, None, None));
                continue;
            };
            let (low, high) = ratio_range(p, r);
            // A knee its repeats contradicted (or never confirmed) is no evidence either way.
            let unconfirmed: Vec<&str> = [p, r]
                .iter()
                .filter(|x| !x.confirmed && x.last_pass.is_some())
                .map(|x| x.arm.as_str())
                .collect();
            let pass = if !unconfirmed.is_empty() {
                notes.push(format!(
                    "{}: the knee of {} was not confirmed (a repeat disagreed, not every repeat ran, or the search did not bracket it: search.json says which)",
                    p.case,
                    unconfirmed.join(" and ")
                ));
                None
            } else if high.is_some_and(|h| h < min && !ge(h, min)) {
                Some(false)
            } else if ge(low, min) {
                Some(true)
            } else {
                None
            };
            notes.push(format!(
                "{}: capacity ratio in [{low:.3}, {}] ({} {}; reference {})",
                p.case,
                high.map_or("unbounded".into(), |h| format!("{h:.3}")),
                p.arm,
                bracket(p),
                bracket(r)
            ));
            levels.push(level(p, Some((low, high)), pass));
        }
        let pass = all3(levels.iter().map(|l| l.pass));
        Ok(Compared::new(levels, pass, Some(notes.join("; "))))
    })
}

/// `passes 4, fails 5`.
fn bracket(p: &OperatingPoint) -> String {
    let or = |v: Option<f64>, none: &str| v.map_or(none.to_string(), |x| x.to_string());
    format!(
        "passes {}, fails {}",
        or(p.last_pass, "none"),
        or(p.first_fail, "none found")
    )
}

fn level(p: &OperatingPoint, range: Option<(f64, Option<f64>)>, pass: Option<bool>) -> GateLevel {
    GateLevel {
        metric: Some(format!("{}: capacity ratio", p.case)),
        measured: range.map(|r| r.0),
        interval: range.and_then(|(lo, hi)| hi.map(|h| [lo, h])),
        pass,
        ..GateLevel::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(arm: &str, pass: Option<f64>, fail: Option<f64>) -> OperatingPoint {
        OperatingPoint {
            arm: arm.into(),
            case: "chat".into(),
            kind: crate::config::search::SearchKind::Concurrency,
            last_pass: pass,
            first_fail: fail,
            stopped: "found".into(),
            confirmed: true,
        }
    }

    fn gate(points: &[OperatingPoint], min: f64) -> Option<bool> {
        let arm = ArmView {
            name: "fit",
            quality: false,
            reference: false,
            unavailable: None,
            cells: Vec::new(),
        };
        capacity_gate(&arm, "ref", points, min).pass
    }

    #[test]
    fn the_gate_passes_fails_or_has_nothing_to_read_as_the_range_lies() {
        let points = [
            point("fit", Some(2.0), Some(3.0)),
            point("ref", Some(4.0), Some(5.0)),
        ];
        assert_eq!(gate(&points, 0.3), Some(true));
        assert_eq!(gate(&points, 0.8), Some(false));
        assert_eq!(gate(&points, 0.5), None);
        // A knee its repeats contradicted reads nothing, whatever its range.
        let mut shaky = points.clone();
        shaky[1].confirmed = false;
        assert_eq!(gate(&shaky, 0.3), None);
        assert_eq!(gate(&points[1..], 0.3), None, "no point of the arm");
    }

    #[test]
    fn half_the_batch_gives_a_range_around_one_half() {
        // The fit arm passes 2 and fails 3; the reference passes 4 and fails 5.
        let (lo, hi) = ratio_range(
            &point("fit", Some(2.0), Some(3.0)),
            &point("ref", Some(4.0), Some(5.0)),
        );
        assert_eq!((lo, hi), (0.4, Some(0.75)));
        // No fail above the arm: no upper end; no pass for the reference: none either.
        assert_eq!(
            ratio_range(
                &point("fit", Some(2.0), None),
                &point("ref", Some(4.0), Some(5.0))
            )
            .1,
            None
        );
        assert_eq!(
            ratio_range(
                &point("fit", Some(2.0), Some(3.0)),
                &point("ref", None, Some(1.0))
            )
            .1,
            None
        );
        assert_eq!(
            ratio_range(
                &point("fit", None, Some(1.0)),
                &point("ref", Some(4.0), Some(5.0))
            )
            .0,
            0.0
        );
    }
}
