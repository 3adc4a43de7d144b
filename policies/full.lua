-- full.lua — plain causal attention over the full KV cache: the baseline.
--
-- What it does: nothing. It defines no handler, so the engine builds no event, computes no
-- score and enters no Lua: running with `--policy full` costs exactly what running with no
-- policy costs, and gives the same tokens (policies/full.test.lua checks both, and the
-- reference fixtures' full runs).
--
-- Paper: none (shared/POLICIES.md "full"). Every other policy, run with a budget >= the prompt
-- length, must produce exactly the tokens of this one.
--
-- Parameters: none.
-- Differences from the reference implementation (tools/policy_ref.py FullPolicy): none.
return {
  name = "full",
  description = "plain attention, full KV cache (the baseline; no handlers, no cost)",
  paper = "baseline (shared/POLICIES.md)",
  params = {},
}
