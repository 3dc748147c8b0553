#pragma once
/// @file
/// ShardedPS's part of a trainer. Sparse variables are sharded over the
/// ranks in table groups (one per element type and width, or one per table
/// with ShardedOptions::group_tables off): a batched lookup routes every
/// group's keys in one route and each group replies once; a step pushes
/// every group's gradient rows in one route, and each owner sums and updates
/// a group at once. Dense variables are sharded too (DenseShards): each
/// owner sums and updates its rows, then every rank gathers the replica it
/// reads.
///
/// The synchronizer is declared, with its registration of variables and its
/// step, in steps.hpp; its members in members.hpp, its batched lookups in
/// lookups.hpp and its lookups of bags in bag_lookups.hpp. Include this one.

#include <parallax/policy/sharded_ps/bag_lookups.hpp>
#include <parallax/policy/sharded_ps/lookups.hpp>
#include <parallax/policy/sharded_ps/members.hpp>
#include <parallax/policy/sharded_ps/steps.hpp>
