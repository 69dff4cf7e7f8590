"""``deviceq api``: the HTTP service through which producers in any language and hosts
without Redis credentials reach a pool. Only this process (with the scheduler and operators)
holds Redis credentials; every host call acts as the host whose token it carries."""
