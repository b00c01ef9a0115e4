//! Secrets of the server's environment kept out of what the runtime hands
//! out of an agent's stderr (research/contract.md, "Agent errors: stderr
//! and hint"): every value whose variable name says it is a secret reads
//! `***` in agent errors, the `session/ended` excerpt and the exit error.

use std::sync::LazyLock;

/// What a masked secret reads as.
const MASK: &str = "***";
/// Shortest environment value masked: shorter ones (`1`, `true`) would mask
/// ordinary words.
const MIN_SECRET_CHARS: usize = 8;
/// Words that make an environment variable's value a secret (its name
/// contains one, in any case).
const SECRET_NAME_WORDS: [&str; 4] = ["KEY", "TOKEN", "SECRET", "PASSWORD"];
/// Secret values of the server's environment, longest first (so a secret
/// that contains another is masked whole). Read once.
pub(super) static SECRETS: LazyLock<Vec<String>> = LazyLock::new(|| secrets(std::env::vars()));

/// The values among `vars` that [`SECRETS`] masks.
fn secrets(vars: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let mut values: Vec<String> = vars
        .filter(|(name, value)| {
            let name = name.to_ascii_uppercase();
            SECRET_NAME_WORDS.iter().any(|word| name.contains(word))
                && value.chars().count() >= MIN_SECRET_CHARS
        })
        .map(|(_, value)| value)
        .collect();
    values.sort_by_key(|value| std::cmp::Reverse(value.len()));
    values.dedup();
    values
}

/// `text` with every secret of the server's environment replaced by
/// [`MASK`]: for every stderr excerpt the runtime hands out (the
/// `session/ended` excerpt and the exit error too).
pub(super) fn mask_secrets(text: String) -> String {
    mask(text, &SECRETS)
}

/// `line` with every secret replaced by [`MASK`].
pub(super) fn mask(line: String, secrets: &[String]) -> String {
    let mut line = line;
    for secret in secrets {
        if line.contains(secret.as_str()) {
            line = line.replace(secret.as_str(), MASK);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_named_values_of_eight_chars_or_more() {
        let vars = [
            ("OPENAI_API_KEY", "sk-abcdefgh"),
            ("github_token", "ghp_12345678"),
            ("MY_SECRET", "short"),
            ("DB_PASSWORD", "hunter2hunter2"),
            ("HOME", "/root/longer/than/eight"),
            ("X_KEY", "sk-abcdefgh-longer"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()));
        let found = secrets(vars.into_iter());
        assert_eq!(
            found,
            [
                "sk-abcdefgh-longer",
                "hunter2hunter2",
                "ghp_12345678",
                "sk-abcdefgh"
            ]
        );
        let masked = mask("key sk-abcdefgh-longer and sk-abcdefgh".into(), &found);
        assert_eq!(masked, "key *** and ***");
    }
}
