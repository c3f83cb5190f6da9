//! Runs the model checker to the end of the state space and sorts what it
//! found: counterexamples to the properties that must always hold, and
//! examples of the paths the model is meant to reach.

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model, Path};

use crate::config::Config;
use crate::model::{ALWAYS, Action, ProtocolModel, State};

/// What one check found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Distinct states reached.
    pub unique_states: usize,
    /// States generated, duplicates included.
    pub states: usize,
    /// The longest path explored, in steps.
    pub max_depth: usize,
    /// For each violated `always` property, the steps that violate it.
    pub counterexamples: Vec<(&'static str, Vec<Action>)>,
    /// The `sometimes` properties an example was found for.
    pub reached: Vec<&'static str>,
    /// How long the check took.
    pub elapsed: Duration,
}

impl Report {
    /// Whether an example of `name` was found.
    pub fn reached(&self, name: &str) -> bool {
        self.reached.contains(&name)
    }

    /// The counterexample to `name`, if one was found.
    pub fn counterexample(&self, name: &str) -> Option<&[Action]> {
        self.counterexamples
            .iter()
            .find(|(found, _)| *found == name)
            .map(|(_, steps)| steps.as_slice())
    }
}

/// Explores every state of `config`'s model breadth first.
pub fn check(config: Config) -> Report {
    explore(config, HasDiscoveries::All)
}

/// Explores `config`'s model breadth first until a property that must always
/// hold is violated, so the counterexample found is among the shortest.
pub fn first_counterexample(config: Config) -> Report {
    explore(config, HasDiscoveries::AnyFailures)
}

fn explore(config: Config, finish_when: HasDiscoveries) -> Report {
    let start = Instant::now();
    let model = ProtocolModel::new(config);
    let checker = model
        .clone()
        .checker()
        .finish_when(finish_when)
        .spawn_bfs()
        .join();
    let mut counterexamples = Vec::new();
    let mut reached = Vec::new();
    for (name, path) in checker.discoveries() {
        if ALWAYS.contains(&name) {
            counterexamples.push((name, until_violated(&model, name, path)));
        } else {
            reached.push(name);
        }
    }
    counterexamples.sort_by_key(|(name, _)| *name);
    reached.sort_unstable();
    Report {
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        counterexamples,
        reached,
        elapsed: start.elapsed(),
    }
}

/// The steps of `path` up to the first state that violates `property`: the
/// checker reports the last path it saw violate it, and the properties are
/// kept by sticky ghost facts, so the tail after the violation adds nothing.
fn until_violated(
    model: &ProtocolModel,
    property: &'static str,
    path: Path<State, Action>,
) -> Vec<Action> {
    let holds = model.property(property).condition;
    let mut steps = Vec::new();
    for (state, action) in path.into_vec() {
        if !holds(model, &state) {
            break;
        }
        steps.extend(action);
    }
    steps
}
