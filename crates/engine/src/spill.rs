//! Spillover: a request for a local model that is saturated (its requests in flight at its
//! limit, or some already waiting) goes to the first of the model's `spillover` places (remote
//! models, in order) that has capacity by the signals its `/metrics` shows: requests waiting,
//! running and KV-cache use, under vLLM's, SGLang's or lemonade's names
//! (`backends::upstream::parse_signals`). Each upstream's metrics are read at most every
//! [`crate::remote::SCRAPE_EVERY`], [`crate::remote::SCRAPE_TIMEOUT`] at most. When no place has capacity the request waits
//! for the local model. The decision and its reason go with the lease (the
//! `x-lemonade-upstream` header) and into `lemonade_spillover_decisions_total`.

use backends::upstream;
use registry::ModelInfo;

use crate::error::Result;
use crate::lifecycle::Lease;
use crate::Engine;

/// Where a request for `info` goes: a lease on a spillover place with capacity (None: the
/// local model), and the decision's words for the local lease when it stays (None: no
/// spillover was considered).
pub async fn place(rt: &Engine, info: &ModelInfo) -> Result<(Option<Lease>, Option<String>)> {
    // Saturation first: it reads the published view only, where the places need the options.
    // A view that shows it saturated may still count a request that has ended (a client that
    // sends its next request as soon as it has the answer); once the owner has taken every
    // release sent, the view says whether it still is.
    if rt.lifecycle.saturated(&info.name).is_none() {
        return Ok((None, None));
    }
    #[cfg(feature = "testing")]
    let settle = !crate::mutation::on(crate::mutation::Mutation::SpillWithoutSettle);
    #[cfg(not(feature = "testing"))]
    let settle = true;
    if settle {
        rt.lifecycle.settled().await;
    }
    let Some(busy) = rt.lifecycle.saturated(&info.name) else { return Ok((None, None)) };
    let places = rt.lifecycle.spillover_of(info);
    if places.is_empty() {
        return Ok((None, None));
    }
    let mut seen = vec![format!("local: {busy}")];
    for place in &places {
        let Ok(Some(mut route)) = rt.remotes.route(place).await else {
            seen.push(format!("{place}: not a remote model now"));
            continue;
        };
        let text = rt.spill.text(rt.remotes.http(), route.in_memory.as_ref(), &route.provider).await;
        let signals = text.as_deref().and_then(|t| upstream::parse_signals(t, &route.id));
        if !upstream::has_capacity(signals.as_ref()) {
            seen.push(format!("{place}: {}", upstream::describe(signals.as_ref())));
            continue;
        }
        match route.provider.admit() {
            Ok(a) => route.admitted = Some(a),
            Err(e) => {
                seen.push(format!("{place}: {e}"));
                continue;
            }
        }
        seen.push(format!("{place}: {}", upstream::describe(signals.as_ref())));
        rt.metrics.spillover(&info.name, place, "saturated");
        tracing::info!(model = %info.name, to = %place, why = %seen.join("; "), "spillover");
        let mut lease = Lease::remote(&rt.lifecycle, route);
        lease.spilled = Some(format!("{place}; reason=\"{}\"", seen.join("; ")));
        return Ok((Some(lease), None));
    }
    rt.metrics.spillover(&info.name, "local", "all_saturated");
    Ok((None, Some(format!("local; reason=\"every place is saturated: {}\"", seen.join("; ")))))
}
