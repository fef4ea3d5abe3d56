"""What the Tinker and Weaver layers share: ordered training calls, calls that answer later,
the base models served and the listing parameters."""
