//! `mongolock release --force [--token N] NAME`: end whatever lease holds NAME (an operator
//! action), or with `--token N` only the lease that still has fencing token N (one conditional
//! write on the server: a holder that took over meanwhile is untouched). The library keeps the
//! fencing token growing, so the next holder's token is larger.

use mongolock::LockProvider;

use crate::cli::{GlobalArgs, ReleaseArgs};
use crate::connect::{connect, Connection};
use crate::exec::describe_holder;
use crate::exit::{self, CliError};
use crate::list::write_stdout;

/// `mongolock release --force`.
pub async fn run(global: &GlobalArgs, args: ReleaseArgs) -> Result<i32, CliError> {
    // clap requires --force; this guards against the definition changing.
    if !args.force {
        return Err(CliError::with_code(
            exit::USAGE,
            "refusing to release without --force",
        ));
    }
    let conn = connect(global).await?;
    let provider = conn.provider(None, None)?;
    if let Some(token) = args.token {
        return release_token(&conn, &provider, &args.name, token).await;
    }
    // Informational only: the holder may change between this read and the release.
    let holder = describe_holder(&provider, &args.name).await;
    let ended = provider
        .force_release(&args.name)
        .await
        .map_err(|e| conn.error(&format!("cannot release lock {:?}", args.name), &e))?;
    if ended {
        let from = holder.map_or_else(String::new, |h| format!(" from {h}"));
        write_stdout(&format!(
            "released lock {:?}{from}; the next holder gets a larger fencing token, and the \
             previous holder learns of the loss at its next renewal\n",
            args.name
        ))?;
        Ok(exit::SUCCESS)
    } else {
        // A distinct status, so that a script can tell "released" from "nobody held it".
        Err(CliError::with_code(
            exit::NOT_FOUND,
            format!("lock {:?} is not held; nothing to release", args.name),
        ))
    }
}

/// `release --force --token N`: the conditional force-release, then (for the message only) a
/// read of who holds the name now.
async fn release_token(
    conn: &Connection,
    provider: &LockProvider,
    name: &str,
    token: u64,
) -> Result<i32, CliError> {
    // Read before the write for the message only: the write itself checks the token.
    let holders = provider.holders(name).await.unwrap_or_default();
    let ended = provider
        .force_release_token(name, token)
        .await
        .map_err(|e| conn.error(&format!("cannot release lock {name:?}"), &e))?;
    if ended {
        let from = holders
            .iter()
            .find(|h| h.fencing_token == token)
            .and_then(|h| h.holder.as_ref())
            .map_or_else(String::new, |h| format!(" from {h}"));
        write_stdout(&format!(
            "released the lease with fencing token {token} on lock {name:?}{from}; the next \
             holder gets a larger fencing token, and the previous holder learns of the loss at \
             its next renewal\n"
        ))?;
        return Ok(exit::SUCCESS);
    }
    // What holds the name now (read after the write; it may change at any time).
    let now = match provider.holders(name).await {
        Ok(h) if h.is_empty() => "it is not held now".to_owned(),
        Ok(h) => {
            let tokens: Vec<String> = h.iter().map(|h| h.fencing_token.to_string()).collect();
            format!(
                "it is held now with fencing token{} {}",
                if tokens.len() == 1 { "" } else { "s" },
                tokens.join(", ")
            )
        }
        Err(_) => "who holds it now could not be read".to_owned(),
    };
    Err(CliError::with_code(
        exit::TOKEN_MISMATCH,
        format!(
            "lock {name:?} has no unexpired lease with fencing token {token} ({now}); nothing \
             was released"
        ),
    ))
}
