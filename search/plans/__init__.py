"""Plans out: the Plan format, the typed reports, the baseline planners and the library's entry
point (`run_search`)."""
