"""Artifacts: the files a run writes into its attempt's folder and its whole log, kept in an
artifact store. `store` holds the store and the name rules, `records` reads what an attempt
recorded, `retention` removes old folders; the host's side (the folder, the spool and the
uploads) is `deviceq.host.artifacts`."""
