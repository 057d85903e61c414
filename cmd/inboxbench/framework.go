package main

// frameworkCases returns the inboxmq cases (d), (e) and (f).
func frameworkCases(e *env) []benchCase {
	return nil
}
