//! A rolling update's bounds: `maxSurge` and `maxUnavailable` resolved against the desired
//! replicas, as MCM (and Kubernetes' deployment util) resolves them.

use capstan_apis::machine::{MachineDeployment, RollingUpdateMachineDeployment};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// MCM's default `maxSurge` and `maxUnavailable`: one Machine each.
pub const DEFAULT_MAX_SURGE: i32 = 1;
pub const DEFAULT_MAX_UNAVAILABLE: i32 = 1;

/// Why a deployment's bounds cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error(
        "spec.strategy.rollingUpdate.{field}: {value:?} is neither a number nor a percent like \"25%\""
    )]
    NotAPercent { field: &'static str, value: String },
    #[error("spec.strategy.rollingUpdate.{field}: must not be negative, got {value}")]
    Negative { field: &'static str, value: String },
    #[error(
        "spec.strategy.rollingUpdate: maxSurge and maxUnavailable are both 0, so no Machine could ever be replaced; set one of them above 0"
    )]
    BothZero,
}

/// Resolved bounds, in Machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_surge: i32,
    pub max_unavailable: i32,
}

fn scaled(
    field: &'static str,
    value: &IntOrString,
    total: i32,
    round_up: bool,
) -> Result<i32, BoundsError> {
    match value {
        IntOrString::Int(n) if *n < 0 => Err(BoundsError::Negative {
            field,
            value: n.to_string(),
        }),
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| BoundsError::NotAPercent {
                    field,
                    value: s.clone(),
                })?;
            if percent < 0 {
                return Err(BoundsError::Negative {
                    field,
                    value: s.clone(),
                });
            }
            let product = percent * i64::from(total.max(0));
            let value = if round_up {
                (product + 99) / 100
            } else {
                product / 100
            };
            Ok(i32::try_from(value).unwrap_or(i32::MAX))
        }
    }
}

/// Checks what the API validation of a deployment refuses: unparsable or negative values, and
/// literal zeros for both (percents that merely round to zero are allowed, see [`resolve`]).
pub fn validate(update: &RollingUpdateMachineDeployment) -> Result<(), BoundsError> {
    let surge = update
        .max_surge
        .clone()
        .unwrap_or(IntOrString::Int(DEFAULT_MAX_SURGE));
    let unavailable = update
        .max_unavailable
        .clone()
        .unwrap_or(IntOrString::Int(DEFAULT_MAX_UNAVAILABLE));
    // Scaled against 100 only to check the shape; a percent "0%" is a zero too.
    let s = scaled("maxSurge", &surge, 100, true)?;
    let u = scaled("maxUnavailable", &unavailable, 100, false)?;
    if s == 0 && u == 0 {
        return Err(BoundsError::BothZero);
    }
    Ok(())
}

/// `maxSurge` rounded up and `maxUnavailable` rounded down against `desired`; when both come
/// out 0 (percents of a small deployment), `maxUnavailable` is 1 so the roll can move
/// (Kubernetes' `ResolveFenceposts`).
pub fn resolve(
    update: &RollingUpdateMachineDeployment,
    desired: i32,
) -> Result<Bounds, BoundsError> {
    validate(update)?;
    let surge = update
        .max_surge
        .clone()
        .unwrap_or(IntOrString::Int(DEFAULT_MAX_SURGE));
    let unavailable = update
        .max_unavailable
        .clone()
        .unwrap_or(IntOrString::Int(DEFAULT_MAX_UNAVAILABLE));
    let max_surge = scaled("maxSurge", &surge, desired, true)?;
    let mut max_unavailable = scaled("maxUnavailable", &unavailable, desired, false)?;
    if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1;
    }
    Ok(Bounds {
        max_surge,
        max_unavailable,
    })
}

/// The bounds of a deployment's rolling strategy (defaults when it names none).
pub fn of(deployment: &MachineDeployment) -> Result<Bounds, BoundsError> {
    let update = deployment
        .spec
        .strategy
        .as_ref()
        .and_then(|s| s.rolling_update.clone())
        .unwrap_or_default();
    let mut bounds = resolve(&update, deployment.spec.replicas)?;
    // Never more unavailable than there are Machines (Kubernetes' `MaxUnavailable`).
    bounds.max_unavailable = bounds.max_unavailable.min(deployment.spec.replicas.max(0));
    Ok(bounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(
        surge: Option<IntOrString>,
        unavailable: Option<IntOrString>,
    ) -> RollingUpdateMachineDeployment {
        RollingUpdateMachineDeployment {
            max_surge: surge,
            max_unavailable: unavailable,
        }
    }

    fn pct(s: &str) -> Option<IntOrString> {
        Some(IntOrString::String(s.into()))
    }

    fn int(n: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(n))
    }

    fn bounds(max_surge: i32, max_unavailable: i32) -> Bounds {
        Bounds {
            max_surge,
            max_unavailable,
        }
    }

    #[test]
    fn unset_bounds_are_one_and_one() {
        assert_eq!(resolve(&update(None, None), 3), Ok(bounds(1, 1)));
    }

    #[test]
    fn percents_round_surge_up_and_unavailable_down() {
        assert_eq!(
            resolve(&update(pct("25%"), pct("25%")), 10),
            Ok(bounds(3, 2))
        );
        assert_eq!(
            resolve(&update(pct("25%"), pct("25%")), 3),
            Ok(bounds(1, 0))
        );
        assert_eq!(
            resolve(&update(pct("30%"), pct("30%")), 1),
            Ok(bounds(1, 0))
        );
        assert_eq!(resolve(&update(pct("150%"), int(0)), 2), Ok(bounds(3, 0)));
    }

    #[test]
    fn percents_that_round_to_zero_leave_one_unavailable() {
        assert_eq!(resolve(&update(pct("0%"), pct("10%")), 3), Ok(bounds(0, 1)));
        assert_eq!(resolve(&update(int(0), pct("20%")), 4), Ok(bounds(0, 1)));
    }

    #[test]
    fn literal_zeros_for_both_are_refused() {
        assert_eq!(
            resolve(&update(int(0), int(0)), 3),
            Err(BoundsError::BothZero)
        );
        assert_eq!(
            resolve(&update(pct("0%"), int(0)), 3),
            Err(BoundsError::BothZero)
        );
    }

    #[test]
    fn garbage_and_negatives_name_the_field() {
        let err = resolve(&update(pct("lots"), None), 3).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "spec.strategy.rollingUpdate.maxSurge: \"lots\" is neither a number nor a percent like \"25%\""
        );
        assert!(matches!(
            resolve(&update(None, int(-1)), 3),
            Err(BoundsError::Negative {
                field: "maxUnavailable",
                ..
            })
        ));
    }

    /// docs/machineset.md MD-1 and MD-2.
    #[test]
    fn md_1_and_2_percent_rounding() {
        assert_eq!(
            resolve(&update(pct("25%"), pct("25%")), 10),
            Ok(bounds(3, 2))
        );
        assert_eq!(
            resolve(&update(pct("25%"), pct("25%")), 3),
            Ok(bounds(1, 0))
        );
    }

    /// MD-3: percents that resolve to 0/0 leave one unavailable. **Decision:** literal 0/0 is
    /// refused (as Kubernetes' Deployment validation does), where MCM accepts it and resolves
    /// it to 0/1 the same way.
    #[test]
    fn md_3_zero_zero() {
        assert_eq!(resolve(&update(pct("0%"), pct("1%")), 2), Ok(bounds(0, 1)));
        assert_eq!(
            resolve(&update(int(0), int(0)), 5),
            Err(BoundsError::BothZero)
        );
    }

    /// MD-4: maxUnavailable is capped at the replicas (and is 0 at 0 replicas).
    #[test]
    fn md_4_unavailable_capped() {
        let mut d = MachineDeployment::new("d", Default::default());
        d.spec.replicas = 5;
        d.spec.strategy = Some(capstan_apis::machine::MachineDeploymentStrategy {
            type_: None,
            rolling_update: Some(update(None, int(10))),
        });
        assert_eq!(of(&d).map(|b| b.max_unavailable), Ok(5));
        d.spec.replicas = 0;
        assert_eq!(of(&d).map(|b| b.max_unavailable), Ok(0));
    }
}
