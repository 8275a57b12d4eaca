//! Which world a component implements, and whether this host speaks its WIT version.

use std::fmt;

/// The WIT package this host implements.
pub const WIT_PACKAGE: &str = "wirl:rl";
/// Its version. Components built against any `0.1.x` load; other majors are refused.
pub const WIT_VERSION: &str = "0.1.0";

/// The worlds of `wirl:rl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum World {
    RewardPlugin,
    EnvironmentPlugin,
    AgentPlugin,
    CodeRunnerPlugin,
    GraderPlugin,
}

impl World {
    pub fn name(self) -> &'static str {
        match self {
            World::RewardPlugin => "reward-plugin",
            World::EnvironmentPlugin => "environment-plugin",
            World::AgentPlugin => "agent-plugin",
            World::CodeRunnerPlugin => "code-runner-plugin",
            World::GraderPlugin => "grader-plugin",
        }
    }

    /// Whether this world exports `wirl:rl/reward` (it can score completions).
    pub fn scores(self) -> bool {
        matches!(self, World::RewardPlugin | World::GraderPlugin)
    }
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An interface name of a component import or export, split: `wirl:rl/reward@0.1.0`.
#[derive(Debug, PartialEq)]
pub(crate) struct InterfaceName<'a> {
    pub package: &'a str,
    pub interface: &'a str,
    pub version: Option<&'a str>,
}

pub(crate) fn parse_interface_name(name: &str) -> Option<InterfaceName<'_>> {
    let (path, version) = match name.split_once('@') {
        Some((path, version)) => (path, Some(version)),
        None => (name, None),
    };
    let (package, interface) = path.split_once('/')?;
    Some(InterfaceName { package, interface, version })
}

/// Whether a component built against `version` of `wirl:rl` works with this host: the same
/// major version, or for 0.x the same minor (semver's rule for pre-1.0 versions).
pub(crate) fn compatible_version(version: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut parts = v.split('.');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    match (parse(version), parse(WIT_VERSION)) {
        (Some((major, minor)), Some((our_major, our_minor))) => {
            major == our_major && (major != 0 || minor == our_minor)
        }
        _ => false,
    }
}

/// Decide the world from a component's exports and imports (as interface names).
pub(crate) fn detect_world(exports: &[String], imports: &[String]) -> Result<World, String> {
    let mut ours = Vec::new();
    for name in exports {
        if let Some(parsed) = parse_interface_name(name)
            && parsed.package == WIT_PACKAGE
        {
            let version = parsed.version.unwrap_or("(unversioned)");
            if !compatible_version(version) {
                return Err(format!(
                    "it was built for {WIT_PACKAGE}@{version}, but this wirl speaks \
                     {WIT_PACKAGE}@{WIT_VERSION}; rebuild it against the wit/ directory of this \
                     wirl version"
                ));
            }
            ours.push(parsed.interface);
        }
    }
    let imports_runner = imports.iter().any(|name| {
        parse_interface_name(name).is_some_and(|p| p.package == WIT_PACKAGE && p.interface == "code-runner")
    });
    let world = match ours.as_slice() {
        ["reward"] if imports_runner => World::GraderPlugin,
        ["reward"] => World::RewardPlugin,
        ["environment"] => World::EnvironmentPlugin,
        ["agent"] => World::AgentPlugin,
        ["code-runner"] => World::CodeRunnerPlugin,
        [] => {
            let shown = if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") };
            return Err(format!(
                "it exports no {WIT_PACKAGE} interface (it exports {shown}); a wirl plugin exports \
                 one of reward, environment, agent or code-runner from {WIT_PACKAGE}@{WIT_VERSION}"
            ));
        }
        several => {
            return Err(format!(
                "it exports several {WIT_PACKAGE} interfaces ({}); a plugin implements exactly one world",
                several.join(", ")
            ));
        }
    };
    Ok(world)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn worlds_are_told_apart_by_exports_and_imports() {
        let reward = names(&["wirl:rl/reward@0.1.0"]);
        assert_eq!(detect_world(&reward, &[]), Ok(World::RewardPlugin));
        assert_eq!(detect_world(&reward, &names(&["wirl:rl/code-runner@0.1.0"])), Ok(World::GraderPlugin));
        assert_eq!(detect_world(&names(&["wirl:rl/environment@0.1.3"]), &[]), Ok(World::EnvironmentPlugin));
        assert!(detect_world(&names(&["wasi:cli/run@0.2.0"]), &[]).unwrap_err().contains("no wirl:rl"));
    }

    #[test]
    fn other_major_versions_are_refused() {
        assert!(compatible_version("0.1.0") && compatible_version("0.1.9"));
        assert!(!compatible_version("0.2.0") && !compatible_version("1.0.0") && !compatible_version("x"));
        let err = detect_world(&names(&["wirl:rl/reward@2.0.0"]), &[]).unwrap_err();
        assert!(err.contains("wirl:rl@2.0.0") && err.contains("rebuild"), "{err}");
    }
}
