"""First-class fakes for the fast test tiers (production code never imports these)."""
