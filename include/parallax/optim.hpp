#pragma once
/// @file
/// Every optimizer: Sgd, Momentum, Adagrad, Adam (AdamW with a weight
/// decay), Groups (an optimizer per group of variables), and the
/// learning-rate schedules. Each updates dense variables in
/// full and sparse variables lazily (touched rows only).

#include <parallax/optim/adagrad.hpp>
#include <parallax/optim/adam.hpp>
#include <parallax/optim/groups.hpp>
#include <parallax/optim/momentum.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/optim/schedule.hpp>
#include <parallax/optim/sgd.hpp>
