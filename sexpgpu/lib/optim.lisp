;;;; sexpgpu/optim -- optimizers and schedules, written with defoptimizer.
;;;;
;;;; (require "sexpgpu/optim" :as optim), then (optim:sgd :lr 0.1) in defgroups.

(defoptimizer sgd (&key lr (weight-decay 0.0))
  "Plain stochastic gradient descent, with optional L2 weight decay."
  (optimizer-update (param grad ctx)
    (- param (* (schedule lr ctx) (if (zerop weight-decay) grad (+ grad (* weight-decay param)))))))

(defoptimizer momentum (&key lr (beta 0.9) (nesterov nil))
  "Heavy-ball momentum (torch.optim.SGD with momentum)."
  (defstate v :init :zeros)
  (optimizer-update (param grad ctx)
    (setf v (+ (* beta v) grad))
    (- param (* (schedule lr ctx) (if nesterov (+ grad (* beta v)) v)))))

(defoptimizer adamw (&key lr (beta1 0.9) (beta2 0.999) (eps 1e-8) (weight-decay 0.01))
  "Adam with decoupled weight decay (torch.optim.AdamW)."
  (defstate m :init :zeros)
  (defstate v :init :zeros)
  (optimizer-update (param grad ctx)
    (let* ((rate (schedule lr ctx))
           (step (+ (ctx :step) 1))
           (decayed (- param (* rate weight-decay param))))
      (setf m (+ (* beta1 m) (* (- 1 beta1) grad)))
      (setf v (+ (* beta2 v) (* (- 1 beta2) (square grad))))
      (let ((m-hat (/ m (- 1 (expt beta1 step)))) (v-hat (/ v (- 1 (expt beta2 step)))))
        (- decayed (/ (* rate m-hat) (+ (sqrt v-hat) eps)))))))

(defun constant (lr)
  "The same learning rate at every step."
  (lambda (step) (declare (ignore step)) lr))
