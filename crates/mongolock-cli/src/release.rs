//! `mongolock release --force NAME`: end whatever lease holds NAME (an operator action).
//! The library keeps the fencing token growing, so the next holder's token is larger.

use crate::cli::{GlobalArgs, ReleaseArgs};
use crate::connect::connect;
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
