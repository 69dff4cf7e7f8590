"""The runtime services the leading scheduler runs beside its passes: webhook deliveries
(`webhooks`, with the receiver that checks them, `webhook_listen`), cron schedules
(`schedules`) and the Prometheus endpoint (`metrics`)."""
