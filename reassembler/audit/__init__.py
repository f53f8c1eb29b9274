"""Stage 4, the audit product for whoever owns the capture: capture-quality numbers and the
gate, the HTML and text reports (from the warehouse alone), and `explain` (one rollout
rerun through verification)."""
